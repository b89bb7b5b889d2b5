import os

import pytest

from shared_stores import build_shared, copy_store  # noqa: F401  (copy_store: for the tests, from one place)

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


@pytest.fixture(scope="session")
def shared_store(tmp_path_factory):
    """``shared_store(recipe, *cli_args, seed=None) -> SharedStore``: the store ``omni-export recipe`` builds for that
    recipe (a shipped name or its data) and options, built once per session for all xdist workers
    (``tests/shared_stores.py``). Read it; to change it, ``copy_store`` it first. When the session ends, every store
    handed out must be exactly as it was built."""
    handed = {}

    def get(recipe, *args, seed=None):
        s = build_shared(tmp_path_factory, recipe, *args, seed=seed)
        handed[s.path] = s
        return s

    yield get
    for s in handed.values():
        s.assert_unchanged()


def pytest_collection_modifyitems(config, items):
    """Files with whole-recipe (slow) tests first, each file kept together and in order: the xdist workers take
    files in this order (``--dist loadfile``), so the long files start at once and the short ones fill in at the
    end, instead of a long file starting last on one worker while the other sits idle."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)
