"""Peak resident memory of this process, per pipeline stage, plus that of the worker processes the stage used.

On Linux the kernel's high-water mark (``VmHWM``) can be reset (``/proc/self/clear_refs``, value 5), so each stage's
own peak is measured exactly. Elsewhere the process-wide peak (``getrusage``) is reported, an upper bound.
Worker processes (``lowering.parallel``) report their own peaks; a stage's peak adds every worker's peak to this
process's, as if all had peaked at the same moment (an upper bound of the stage's footprint)."""
from __future__ import annotations

import ctypes
import functools
import resource
import sys
import time


_workers: dict[int, int] = {}  # worker pid -> its peak RSS in bytes, since the last reset


def note_worker_peak(pid: int, peak_bytes: int) -> None:
    _workers[pid] = max(_workers.get(pid, 0), int(peak_bytes))


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim  # glibc; elsewhere (musl) there is no such call
    except (OSError, AttributeError):
        return None


def release_free_heap() -> None:
    """Give the heap memory this process has freed back to the system (glibc's ``malloc_trim``). glibc keeps freed
    blocks below its mmap threshold in its arenas; after a full-size QDQ build and its parity that was ~1 GiB the
    process no longer used (1.63 -> 0.60-0.79 GiB resident, ``benchmarks/recipe_resources.py``), counted in every
    later stage's peak and in the room ``lowering.parallel`` leaves for worker processes. A no-op where there is
    no such call."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def reset_peak() -> bool:
    """Start a new high-water mark, after handing freed heap back (``release_free_heap``: what earlier work freed is
    not the new peak's); False where the platform cannot (the peak then covers the whole process)."""
    release_free_heap()
    _workers.clear()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    """This process's peak since the last reset, plus the peaks its worker processes reported since then."""
    return own_peak_rss_bytes() + sum(_workers.values())


def _status_bytes(key: str) -> int | None:
    """A ``/proc/self/status`` memory line (``VmRSS``, ``VmHWM``) in bytes; None where there is no such file."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def current_rss_bytes() -> int:
    """This process's resident set now (0 where the platform does not say)."""
    return _status_bytes("VmRSS") or 0


def own_peak_rss_bytes() -> int:
    peak = _status_bytes("VmHWM")
    if peak is not None:
        return peak
    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return ru if sys.platform == "darwin" else ru * 1024  # bytes on macOS, KiB elsewhere


class Stage:
    """A named pipeline stage: adds its wall time to ``timings`` and its own peak memory to ``peak_rss`` (bytes),
    shows a spinner on ``console`` while it runs and logs its time when it finishes."""

    def __init__(self, name: str, timings: dict, peak_rss: dict, console):
        self.name, self.timings, self.peak_rss, self.console = name, timings, peak_rss, console

    def __enter__(self):
        reset_peak()
        self.t = time.perf_counter()
        self.status = self.console.status(f"[bold]{self.name}[/]…")
        self.status.__enter__()

    def __exit__(self, *exc):
        self.status.__exit__(*exc)
        dt = time.perf_counter() - self.t
        self.timings[self.name] = round(self.timings.get(self.name, 0.0) + dt, 3)
        self.peak_rss[self.name] = max(self.peak_rss.get(self.name, 0), peak_rss_bytes())
        if exc[0] is None:
            self.console.log(f"{self.name}: {dt:.1f} s")
