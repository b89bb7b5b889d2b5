"""One real store for the gate and report tests: spark_fp16 on the tiny preset (fp32 ONNX on ORT CPU + an HTP fp16
context binary on the QNN HTP simulator, 20 simulator steps), built once per test session for every xdist worker
(``shared_store``, tests/conftest.py); the tests copy it before changing anything."""
import pytest

from omni_export.errors import EXIT_OK


@pytest.fixture(scope="session")
def fp16_store(shared_store):
    s = shared_store("spark_fp16", "--simulator-steps", "20")
    assert s.exit_code == EXIT_OK, s.out
    return s.path
