"""Per-step latency of the Spark-X2.5 decode step on every CPU runtime here, in one run, as ratios vs eager PyTorch.

Runtimes: eager PyTorch fp32, ONNX Runtime CPU fp32, ONNX Runtime CPU QDQ w8a16 (calibrated), ExecuTorch XNNPACK
fp32 and dynamic int8 (w8a8_dynamic). Each artifact is built by the same pipeline a recipe uses (store under a temp
dir unless --store), then timed over the same feeds (one decode position of a real host loop, caches filled).
Writes JSON with provenance (toolchain, source revision, model) and prints a table.

    python benchmarks/spark_step_latency.py                 # tiny preset
    python benchmarks/spark_step_latency.py --preset full   # the 1.7B decode step: needs most of a 24 GiB machine
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from omni_export.artifacts.hashing import path_bytes
from omni_export.artifacts.provenance import git_revision, toolchain
from omni_export.artifacts.store import Store, write_json_atomic
from omni_export.families import load_prompt_set
from omni_export.pipeline import Pipeline
from omni_export.devices import get_device
from omni_export.exporters import get_target
from omni_export.recipes import Build, load_recipe
from omni_export.schemes import get_scheme

RUNS = (("onnx", "fp32"), ("qdq_onnx", "w8a16"), ("executorch", "fp32"), ("executorch", "w8a8_dynamic"))


def time_steps(run, feeds, warmup: int, reps: int) -> dict:
    for f in feeds[:warmup]:
        run(f)
    ts = []
    for _ in range(reps):
        for f in feeds:
            t = time.perf_counter()
            run(f)
            ts.append(time.perf_counter() - t)
    return {"median_ms": round(1e3 * statistics.median(ts), 3), "p90_ms": round(1e3 * sorted(ts)[int(0.9 * len(ts))], 3),
            "calls": len(ts)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--context", type=int, help="context length (default: the spark_w8a16 recipe's)")
    ap.add_argument("--steps", type=int, default=8, help="distinct decode positions timed")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--store", help="artifact store (default: a temporary directory)")
    ap.add_argument("--out", default="spark_step_latency.json")
    ap.add_argument("--runs", default=",".join(f"{t}/{s}" for t, s in RUNS),
                    help="comma-separated TARGET/SCHEME builds to time beside eager (default: all)")
    ap.add_argument("--build-only", metavar="TARGET/SCHEME", help=argparse.SUPPRESS)  # one build, in a child process
    args = ap.parse_args(argv)
    console = Console(stderr=True)
    runs = [tuple(r.split("/")) for r in args.runs.split(",") if r]
    if any(r not in RUNS for r in runs):
        ap.error(f"--runs: choose from {', '.join(f'{t}/{s}' for t, s in RUNS)}")
    if args.store is None and args.preset != "tiny":
        ap.error("--store is required beyond the tiny preset (each artifact is built in its own process)")

    base = load_recipe("spark_w8a16").with_overrides(preset=args.preset, context=args.context)
    et = load_recipe("spark_executorch")
    recipe = dataclasses.replace(base, name="bench_spark_step", builds=tuple(Build(t, s) for t, s in RUNS),
                                 thresholds={**base.thresholds, "w8a8_dynamic": et.thresholds["w8a8_dynamic"]})
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(args.store or tmp))
        if not args.build_only and args.preset != "tiny":
            # Full size: each artifact is built in a child process, so the memory an exporter leaves in this
            # process's heap (ORT quantization, ExecuTorch lowering) is returned before the next one starts;
            # this process then finds every build in the store's step cache and only times.
            for t, s in runs:
                cmd = [sys.executable, __file__, "--preset", args.preset, "--store", str(store.root),
                       "--build-only", f"{t}/{s}"] + (["--context", str(args.context)] if args.context else [])
                if subprocess.run(cmd).returncode:
                    raise SystemExit(f"building {t}/{s} failed")
        pipe = Pipeline(recipe, store, console)
        comp = pipe.load_components()["decode_step"]
        calibrated = [(t, s) for t, s in runs if get_scheme(s).calibrated and get_scheme(s).quantized]
        cal = pipe.calibration_set(comp, load_prompt_set(recipe.prompts.calibration)) if calibrated else None
        device = get_device(recipe.device)

        def source(t, s):
            return pipe._build(comp, get_target(t), get_scheme(s), device, cal, source)

        if args.build_only:
            source(*args.build_only.split("/"))
            return 0

        # feeds: a real host loop over one prompt, then the last `steps` positions (caches filled)
        prompt = comp.encode(load_prompt_set(recipe.prompts.parity).prompts[0], recipe.prompts.max_prompt_tokens)
        feeds = []
        comp.run_tokens(comp.eager_runner(), prompt, record=lambda f: feeds.append({k: v.copy() for k, v in f.items()}),
                        n_new=args.steps)
        feeds = feeds[-args.steps:]
        # eager as a PyTorch user runs it: the whole model resident (no part-by-part page release)
        eager = comp.eager_runner(comp.module, [s.name for s in comp.input_specs()])
        rows = {"eager pytorch fp32": {**time_steps(eager, feeds, 2, args.reps), "bytes": None}}
        comp.release_weights()
        for t, s in runs:
            with pipe._stage(f"export {t}/{s}"):
                built = source(t, s)
            ex = get_target(t).execution(built, comp, device)
            label = f"{ex.runtime} {s}"
            rows[label] = {**time_steps(ex.run, feeds, 2, args.reps),
                           "bytes": sum(path_bytes(built.dir / f) for f in built.files.values())}
            del ex  # one runtime's sessions alive at a time
            gc.collect()
    eager = rows["eager pytorch fp32"]["median_ms"]
    for r in rows.values():
        r["ratio_vs_eager"] = round(r["median_ms"] / eager, 3)
    result = {"benchmark": "spark decode step latency", "preset": args.preset, "context": recipe.context,
              "timed_positions": args.steps, "reps": args.reps, "threads": "ORT intra-op 2; ExecuTorch default",
              "model": pipe.bundle.provenance(), "toolchain": toolchain(), "source_revision": git_revision(),
              "results": rows}
    write_json_atomic(Path(args.out), result)
    t = Table(title=f"Spark decode step, preset {args.preset}, context {recipe.context}")
    for c in ("runtime / scheme", "median ms", "p90 ms", "x eager", "artifact MB"):
        t.add_column(c)
    for k, r in rows.items():
        t.add_row(k, f"{r['median_ms']:.3f}", f"{r['p90_ms']:.3f}", f"{r['ratio_vs_eager']:.2f}",
                  "-" if r["bytes"] is None else f"{r['bytes'] / 1e6:.2f}")
    Console().print(t)
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
