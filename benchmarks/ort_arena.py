"""Time a step and peak RSS of a chain of QDQ parts on ORT CPU under each memory-arena setting, in a fresh process
per setting: ``off`` (what ``runtimes.ort.cpu_session`` uses), ``on`` (one arena per session), ``shrink`` (arenas
shrunk after every run), ``shared`` (one arena registered for all sessions). Random inputs (timing only).

    python benchmarks/ort_arena.py DIR --steps 4     # DIR: a QDQ build with part0.onnx ... partN.onnx
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

MODES = ("off", "on", "shrink", "shared")


def one(d: Path, mode: str, steps: int) -> dict:
    from omni_export import memory
    from omni_export.runtimes.ort import _ort
    ort = _ort()
    if mode == "shared":
        mi = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
        ort.create_and_register_allocator(mi, ort.OrtArenaCfg(0, 1, -1, -1))
    sessions = []
    for p in sorted(d.glob("part*.onnx"), key=lambda p: int(p.stem[4:])):
        so = ort.SessionOptions()
        so.intra_op_num_threads = 2
        so.enable_cpu_mem_arena = mode != "off"
        if mode == "shared":
            so.add_session_config_entry("session.use_env_allocators", "1")
        sessions.append(ort.InferenceSession(str(p), so, providers=["CPUExecutionProvider"]))
    rs = np.random.RandomState(0)
    feeds = [{i.name: (rs.standard_normal([x if isinstance(x, int) else 1 for x in i.shape]) * 0.1).astype(np.float32)
              for i in s.get_inputs()} for s in sessions]
    ro = ort.RunOptions()
    if mode == "shrink":
        ro.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    memory.reset_peak()
    t = time.perf_counter()
    for _ in range(steps):
        for s, f in zip(sessions, feeds):
            s.run(None, f, ro)
    return {"mode": mode, "seconds_per_step": round((time.perf_counter() - t) / steps, 2),
            "peak_rss_gib": round(memory.peak_rss_bytes() / 2**30, 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--mode", choices=MODES)
    ap.add_argument("--out", type=Path, default=Path("ort_arena.json"))
    a = ap.parse_args(argv)
    if a.mode:  # one setting, in this process
        print(json.dumps(one(a.dir, a.mode, a.steps)))
        return 0
    from omni_export.artifacts.provenance import git_revision, toolchain
    from omni_export.artifacts.store import write_json_atomic
    rows = []
    for m in MODES:
        out = subprocess.run([sys.executable, __file__, str(a.dir), "--steps", str(a.steps), "--mode", m],
                             check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        print(rows[-1])
    write_json_atomic(a.out, {"benchmark": "ORT CPU memory arena settings, chain of QDQ parts", "parts_dir": a.dir.name,
                              "steps": a.steps, "results": rows, "toolchain": toolchain(),
                              "source_revision": git_revision()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
