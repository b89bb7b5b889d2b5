import os

import pytest

# pytest-xdist runs test files in parallel workers (pyproject addopts): the cores are shared out among them, for
# torch (OMP_NUM_THREADS), onnxruntime's CPU sessions (OMNI_EXPORT_THREADS) and the exporters' per-part worker
# processes (OMNI_EXPORT_PART_WORKERS), instead of every test worker spinning 2 of each.
_threads = str(max(1, min(2, (os.cpu_count() or 2) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))))
os.environ.setdefault("OMP_NUM_THREADS", _threads)
os.environ.setdefault("OMNI_EXPORT_THREADS", _threads)
os.environ.setdefault("OMNI_EXPORT_PART_WORKERS", _threads)


@pytest.fixture(scope="session")
def tiny_spark():
    from omni_export.families import build_model
    return build_model("spark", "tiny", seed=0)


def pytest_collection_modifyitems(config, items):
    """Files with whole-recipe (slow) tests first, each file kept together and in order: the xdist workers take
    files in this order (``--dist loadfile``), so the long files start at once and the short ones fill in at the
    end, instead of a long file starting last on one worker while the other sits idle."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)
