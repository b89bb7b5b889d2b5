"""Per-part work in worker processes. The QNN compiler is single-threaded, so on 2 cores two parts at a time
shorten that step (full size, ``benchmarks/recipe_resources.py``: context binaries 95.0 -> 60.2 s for the decode
step's 4 parts, 112.4 -> 71.5 s for the prefill's).

Workers are spawned processes (no fork of a process holding torch's thread pools) that run a module-level function
on paths and small arguments; each reports its peak RSS, which the stage's memory figure includes
(``memory.note_worker_peak``). ``OMNI_EXPORT_PART_WORKERS`` sets the number (default: min(2, cores)); 1, or a
single part, runs the work in this process as before, unless the caller asks for ``isolated`` workers: then every job
runs in a fresh spawned process, even alone. The QNN compiler needs that: the order of its op tables in a context
binary follows the heap layout of the process it runs in, so the same graph compiled inline after different work
(a store at a longer path, another recipe first) gave context binaries that differ in 1.7 MB of 7 MB; in a fresh
process it is byte-identical run after run (``tests/test_end_to_end.py``, two checkouts).

Memory: a caller that knows what one job holds (``job_bytes``, see ``job_estimate``) gets only as many workers as
fit beside this process's resident set in ``OMNI_EXPORT_MEMORY_GIB`` (default 6, the full-size budget of a smaller
laptop; set it higher to let more parts run side by side on a larger machine). Measured at
full size (Spark 1.7B, parts of 1.6-1.85 GB fp32, 0.41-0.46 GB int8): two quantization workers beside the pipeline
summed to 11.8 GiB (and were 5 s faster than one part at a time), so there quantization runs one part at a time;
two compile workers beside the pipeline summed to 5.4-7.8 GiB (``benchmarks/results/recipe_resources_*full*.json``);
with parts of <= 1.25 GiB fp32 (``max_part_bytes`` in the recipe's full preset) and the pipeline's freed heap handed back first
(``memory.release_free_heap``), two compiles run side by side at 5.6-5.8 GiB."""
from __future__ import annotations

import multiprocessing as mp
import os
import resource
import sys
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

from .. import memory


WORKER_BASE = 2**30  # a worker's interpreter, onnx, onnxruntime and QNN libraries
MEMORY_GIB = 6       # default of OMNI_EXPORT_MEMORY_GIB


def job_estimate(built, graphs, per_byte: float) -> int | None:
    """What one job holds: a worker's base plus ``per_byte`` times the largest weight file among ``graphs`` of the
    build it reads (``<graph>.weights``); None (no estimate) when the build has no weight files."""
    files = [built.path(f"{g.name}.weights") for g in graphs if f"{g.name}.weights" in built.files]
    return int(WORKER_BASE + per_byte * max(p.stat().st_size for p in files)) if files else None


def part_workers(n_parts: int, job_bytes: int | None = None) -> int:
    env = os.environ.get("OMNI_EXPORT_PART_WORKERS")
    n = int(env) if env else min(2, os.cpu_count() or 1)
    if job_bytes and not env:
        memory.release_free_heap()  # freed heap this process still holds is room for a worker
        room = float(os.environ.get("OMNI_EXPORT_MEMORY_GIB") or MEMORY_GIB) * 2**30 - memory.current_rss_bytes()
        n = min(n, int(room // job_bytes))
    return max(1, min(n, n_parts))


def _one_core() -> None:
    """Worker start: one thread each (two workers share two cores), for torch and ORT CPU sessions alike."""
    os.environ["OMP_NUM_THREADS"] = os.environ["OMNI_EXPORT_THREADS"] = "1"
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


def _run(fn, args):
    out = fn(*args)
    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return out, os.getpid(), ru if sys.platform == "darwin" else ru * 1024


class PartPool:
    """``submit(fn, *args, then=callback)`` runs ``fn(*args)`` in a worker (or here, with one worker) and calls
    ``then(result)`` in this process when it is done. At most ``workers`` jobs are in flight: ``submit`` waits for a
    free slot, so no more than that many parts are in memory at once. Leaving the block waits for every job and
    raises the first failure; on an error in this process, pending jobs are cancelled."""

    def __init__(self, n_parts: int, job_bytes: int | None = None, isolated: bool = False):
        self.workers = part_workers(n_parts, job_bytes)
        self.inline = self.workers == 1 and not isolated  # work runs in this process, at submit
        self.pending: list = []
        self.ex = None
        if not self.inline:
            self.ex = ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"), initializer=_one_core)

    def __enter__(self):
        return self

    def submit(self, fn, *args, then=None) -> None:
        if self.ex is None:
            out = fn(*args)
            if then is not None:
                then(out)
            return
        while len(self.pending) >= self.workers:
            self._reap(wait([f for f, _ in self.pending], return_when=FIRST_COMPLETED).done)
        self.pending.append((self.ex.submit(_run, fn, args), then))

    def _reap(self, done) -> None:
        for f, then in [p for p in self.pending if p[0] in done]:
            self.pending.remove((f, then))
            out, pid, peak = f.result()  # a worker's exception is raised here
            memory.note_worker_peak(pid, peak)
            if then is not None:
                then(out)

    def __exit__(self, exc_type, *exc):
        if self.ex is None:
            return False
        try:
            if exc_type is None:
                while self.pending:
                    self._reap(wait([f for f, _ in self.pending], return_when=FIRST_COMPLETED).done)
        finally:
            self.ex.shutdown(wait=True, cancel_futures=True)
        return False
