import os

import pytest

from shared_stores import build_shared, copy_store  # noqa: F401  (copy_store: for the tests, from one place)
from xdist_units import ORDER, UNITS, work_unit

# pytest-xdist runs test files in parallel workers (pyproject addopts): the cores are shared out among them, for
# torch (OMP_NUM_THREADS), numpy's OpenBLAS (OPENBLAS_NUM_THREADS), onnxruntime's CPU sessions (OMNI_EXPORT_THREADS)
# and the exporters' per-part worker processes (OMNI_EXPORT_PART_WORKERS), instead of every test worker spinning 2 of
# each. Only a process that runs tests sets them: xdist's controller imports this file too, and whatever it set
# would be inherited by its workers and win over their own share (it did: 2 threads per worker on 2 cores, each
# spin-waiting on the other, measured in docs/ci.md). A value the user set before pytest started is kept.
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMNI_EXPORT_THREADS", "OMNI_EXPORT_PART_WORKERS")


def share_cores(workers: int) -> None:
    n = str(max(1, min(2, (os.cpu_count() or 2) // max(1, workers))))
    for var in THREAD_VARS:
        os.environ.setdefault(var, n)


def own_core(worker: str, workers: int) -> None:
    """With a core for each worker, worker N runs on core N alone, and every process it starts there too: the HTP
    simulator keeps a second thread busy in every call unless pinned (``omni_export.runtimes.cores``), and a pinned
    thread would otherwise take the core it happened to be on, which may be the other worker's."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if workers > 1 and len(cores) >= workers and worker.startswith("gw") and worker[2:].isdigit():
        os.sched_setaffinity(0, {cores[int(worker[2:]) % len(cores)]})


if "PYTEST_XDIST_WORKER" in os.environ:  # an xdist worker: before any test module imports torch or numpy
    share_cores(int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    own_core(os.environ["PYTEST_XDIST_WORKER"], int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))


def pytest_configure(config):
    """One process that runs the tests itself (``-n 0``, ``-p no:xdist``) takes the cores; xdist's controller takes
    nothing, so its workers size their own share."""
    controller = config.pluginmanager.hasplugin("xdist") and config.getoption("numprocesses")
    if "PYTEST_XDIST_WORKER" not in os.environ and not controller:
        share_cores(1)


@pytest.fixture(scope="session")
def tiny_spark():
    from omni_export.families import build_model
    return build_model("spark", "tiny", seed=0)


@pytest.fixture(scope="session")
def small(tmp_path_factory):
    """A two-layer Spark decode step, its rewritten fp32 graph and calibration set (``small_decode_step``)."""
    from small_decode_step import build_small
    return build_small(tmp_path_factory)


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
    """Files in ``LONGEST_FIRST`` order, then the other files with whole-recipe (slow) tests, then the rest; each
    file kept together and in its own order."""
    root = config.rootpath / "tests"
    rank = {root / f: r for f, r in ORDER.items()}
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: (rank.get(item.path, (len(UNITS), 0)), item.path not in slow))


@pytest.hookimpl(optionalhook=True)  # an xdist hook: unknown under ``-p no:xdist``
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile``, with each tuple of ``LONGEST_FIRST`` one unit of work: its files go to one worker, in
    order (xdist's own scheduler for any other ``--dist``)."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class StoreUnits(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return StoreUnits(config, log)


def pytest_addoption(parser, pluginmanager):
    """``pytest -p no:xdist`` (one process, no xdist at all) still accepts the ``-n``/``--dist`` of the pyproject's
    addopts, and ignores them; with xdist loaded, ``-n 0`` is the single-process run (docs/ci.md)."""
    if not pluginmanager.hasplugin("xdist"):
        group = parser.getgroup("xdist", "pytest-xdist disabled (-p no:xdist): its options are ignored")
        group._addoption("-n", "--numprocesses", dest="numprocesses", default=None)  # as xdist declares it
        group._addoption("--dist", dest="dist", default="no")
        group._addoption("--no-loadscope-reorder", dest="loadscopereorder", action="store_false")
