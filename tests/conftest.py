import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "2")


@pytest.fixture(scope="session")
def tiny_spark():
    from omni_export.models import build_model
    return build_model("spark", "tiny", seed=0)
