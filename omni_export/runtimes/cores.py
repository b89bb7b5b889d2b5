"""One core for the QNN HTP simulator.

The x86 HTP simulator (onnxruntime-qnn's libQnnHtp, and libGenie on it) keeps a second thread busy while it computes,
unless the threads it starts when a session is made and when it runs are on one core: one call of the trained Gemma 3
270M's w8a16 decode step took 17.6-17.7 s of wall time and 35 s of CPU unpinned (20.7 s user, 14.4 s system), and
18.4-18.5 s of wall time and as much CPU, all user, pinned (``python benchmarks/simulator_core.py``,
``benchmarks/results/simulator_core.json``). The second core's work is wasted: with two test workers on two cores it
was taken from the other worker, and in a pipeline from whatever else runs. ``one_core`` pins the calling thread,
and every thread the simulator starts from it, to one core for the duration of a block (``runtimes.ort.
simulator_runner`` makes a session and runs every call in one); the process keeps that core for every later block.
"""
from __future__ import annotations

import contextlib
import ctypes
import os

_CORE: int | None = None


def _current_cpu(allowed: set[int]) -> int:
    try:
        cpu = int(ctypes.CDLL(None).sched_getcpu())
    except (OSError, AttributeError):
        cpu = -1
    return cpu if cpu in allowed else min(allowed)


def simulator_core(allowed: set[int]) -> int:
    """The core this process runs the simulator on: the one it was on at its first simulator call."""
    global _CORE
    if _CORE is None or _CORE not in allowed:
        _CORE = _current_cpu(allowed)
    return _CORE


def _allowed() -> set[int]:
    """The cores the calling thread may run on (empty where affinity cannot be read)."""
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()


@contextlib.contextmanager
def one_core():
    """Run the block with the calling thread pinned to the process's simulator core; a process already on one core,
    or where affinity cannot be set, runs it as it is."""
    before = _allowed()
    if len(before) <= 1:
        yield
        return
    os.sched_setaffinity(0, {simulator_core(before)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def pin_process() -> None:
    """Pin this whole process to its simulator core (a worker process that runs nothing but the simulator)."""
    if len(allowed := _allowed()) > 1:
        os.sched_setaffinity(0, {simulator_core(allowed)})
