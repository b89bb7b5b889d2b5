"""Per-part work in worker processes. Compiling a part for the HTP and quantizing it are single-threaded (one
full-size Spark part: its context binary took 23.8 s wall for 20.4 s of CPU; its quantization 24.4 s alone and
27-28 s each with two running side by side), so on 2 cores two parts at a time nearly halve those steps.

Workers are spawned processes (no fork of a process holding torch's thread pools) that run a module-level function
on paths and small arguments; each reports its peak RSS, which the stage's memory figure includes
(``memory.note_worker_peak``). ``OMNI_EXPORT_PART_WORKERS`` sets the number (default: min(2, cores)); 1, or a
single part, runs the work in this process as before."""
from __future__ import annotations

import multiprocessing as mp
import os
import resource
import sys
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

from .. import memory


def part_workers(n_parts: int) -> int:
    env = os.environ.get("OMNI_EXPORT_PART_WORKERS")
    n = int(env) if env else min(2, os.cpu_count() or 1)
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

    def __init__(self, n_parts: int):
        self.workers = part_workers(n_parts)
        self.inline = self.workers == 1  # work runs in this process, at submit
        self.pending: list = []
        self.ex = None
        if self.workers > 1:
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
