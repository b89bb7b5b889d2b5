"""Wall time and CPU time (user, system) of HTP simulator calls of one context binary, unpinned and with the calling
thread on one core while the session is made and while it runs (``runtimes.cores.one_core``), each in a fresh
process; random inputs (timing only). JSON out.

    python benchmarks/simulator_core.py CTX_ONNX --calls 2 --out benchmarks/results/simulator_core.json
    (CTX_ONNX: a ``*_ctx.onnx`` of a qnn_context build, e.g. the trained Gemma 3's w8a16 decode step)
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def one(ctx: Path, pinned: bool, calls: int) -> dict:
    from omni_export.devices import get_device
    from omni_export.runtimes.cores import one_core
    from omni_export.runtimes.ort import htp_session

    with one_core() if pinned else contextlib.nullcontext():
        sess = htp_session(ctx, get_device("galaxy_s25"), fp16=False)
    rs = np.random.RandomState(0)
    feed = {i.name: (rs.standard_normal([x if isinstance(x, int) else 1 for x in i.shape]) * 0.1).astype(np.float32)
            for i in sess.get_inputs()}
    names = [o.name for o in sess.get_outputs()]
    out = []
    for _ in range(calls):
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        if pinned:
            with one_core():
                sess.run(names, feed)
        else:
            sess.run(names, feed)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        out.append({"wall_s": round(time.perf_counter() - t0, 2), "user_s": round(r1.ru_utime - r0.ru_utime, 2),
                    "system_s": round(r1.ru_stime - r0.ru_stime, 2)})
    return {"pinned": pinned, "calls": out}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ctx")
    ap.add_argument("--calls", type=int, default=2)
    ap.add_argument("--out", default="simulator_core.json")
    ap.add_argument("--one", choices=("pinned", "unpinned"), help=argparse.SUPPRESS)  # the child process
    a = ap.parse_args(argv)
    if a.one:
        print(json.dumps(one(Path(a.ctx), a.one == "pinned", a.calls)))
        return 0
    from omni_export.artifacts.provenance import git_revision, toolchain
    runs = {}
    for mode in ("unpinned", "pinned"):
        p = subprocess.run([sys.executable, __file__, a.ctx, "--calls", str(a.calls), "--one", mode],
                           capture_output=True, text=True, check=True)
        runs[mode] = json.loads(p.stdout.strip().splitlines()[-1])
    res = {"benchmark": "HTP simulator calls: unpinned vs one core", "context_binary": Path(a.ctx).name,
           "cpus": os.cpu_count(), "runs": runs, "toolchain": toolchain(), "source_revision": git_revision(),
           "command": "python benchmarks/simulator_core.py CTX_ONNX --calls %d --out %s" % (a.calls, a.out)}
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
