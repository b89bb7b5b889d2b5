"""Wall and CPU time of the parts of one ``qdq_onnx`` export (the fp32 source, the batched calibration copy, the
calibration pass, sample reads, the weight-scale search, onnxruntime's quantizer), on a store a recipe already ran.

The recipe is narrowed to one component and its ``onnx``/``fp32`` and ``qdq_onnx`` builds (written into the store as
``bench-recipe.yaml``) and run once on a new store. Then every other step is a finished step of that store: the
package's source fingerprint is pinned to the one the store's fp32 reference was built with, and only the QDQ export
and its calibration pass are removed and built again, timed, so the same code checked out twice (or an older copy
first on ``PYTHONPATH``) is timed on the same inputs. Parity of the rebuilt files is a finished step when their
bytes are the stored ones (the run prints "the same files were measured before (reused)"); the JSON holds the
rebuilt files' sha256.

    python benchmarks/qdq_export_stages.py smollm2_w8a16 --component decode_step --store S \
        --out benchmarks/results/qdq_export_stages_smollm2.json

Set ``OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMNI_EXPORT_THREADS=1 OMNI_EXPORT_PART_WORKERS=1`` for the
single-thread figures of a test worker. The machine's load average is recorded beside the figures.
"""
from __future__ import annotations

import argparse
import functools
from importlib import resources
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

REMOVED = ("export-qdq_onnx", "activation-ranges")
PARTS = (  # (module, attribute, label)
    ("omni_export.exporters.qdq_onnx", "qdq_source", "fp32 source (conv rewrite)"),
    ("omni_export.exporters.qdq_onnx", "batched_source", "batched calibration copy (export)"),
    ("omni_export.quantize.minmax_pass", "_minmax_pass", "calibration pass (both passes, sample reads included)"),
    ("omni_export.calibration.dataset", "read_sample", "calibration sample reads"),
    ("omni_export.quantize.qdq", "search_scales", "weight-scale search"),
    ("onnxruntime.quantization", "quantize_static", "onnxruntime quantize_static"),
)


def _timed(obj, name: str, label: str, into: dict) -> None:
    f = getattr(obj, name)

    @functools.wraps(f)
    def run(*a, **k):
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            return f(*a, **k)
        finally:
            e = into.setdefault(label, {"wall_s": 0.0, "cpu_s": 0.0, "calls": 0})
            e["wall_s"] += time.perf_counter() - t0
            e["cpu_s"] += time.process_time() - c0
            e["calls"] += 1
    setattr(obj, name, run)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe", help="a shipped recipe name or a recipe file")
    ap.add_argument("--component", required=True)
    ap.add_argument("--scheme", default="w8a16")
    ap.add_argument("--store", type=Path, required=True, help="built here first when it has no fp32 reference")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    import importlib

    import yaml

    import omni_export.pipeline as pipeline
    from omni_export.artifacts.provenance import source_fingerprint
    from omni_export.commands.cli import main as cli

    running = source_fingerprint()["sha256"]
    recipe = args.store / "bench-recipe.yaml"
    if not (args.store / "cache" / "reference").is_dir():
        shipped = resources.files("omni_export.recipes").joinpath(f"{args.recipe}.yaml")
        data = yaml.safe_load(shipped.read_text() if shipped.is_file() else Path(args.recipe).read_text())
        data.update(name=f"{data['name']}-{args.component}", components=[args.component],
                    builds=[{"target": "onnx", "scheme": "fp32"}, {"target": "qdq_onnx", "scheme": args.scheme}],
                    options={k: v for k, v in (data.get("options") or {}).items() if k == args.component},
                    thresholds={k: v for k, v in data["thresholds"].items()
                                if "/" not in k or k.split("/")[0] == args.component})
        args.store.mkdir(parents=True)
        recipe.write_text(yaml.safe_dump(data, sort_keys=False))
        first = cli(["recipe", str(recipe), "--store", str(args.store)])
        if first:
            raise SystemExit(f"the first run of {recipe.name} exited {first}")
    if not recipe.is_file():
        raise SystemExit(f"{args.store} has a reference but no {recipe.name}: not a store this script built")
    (ref,) = (args.store / "cache" / "reference").iterdir()
    source = json.loads((ref / "key.json").read_text())["source"]
    pipeline.source_fingerprint = lambda: {"sha256": source, "files": 0}
    for kind in REMOVED:
        shutil.rmtree(args.store / "cache" / kind, ignore_errors=True)
    parts: dict = {}
    for mod, name, label in PARTS:
        _timed(importlib.import_module(mod), name, label, parts)
    from omni_export.exporters.qdq_onnx import QdqOnnx
    _timed(QdqOnnx, "export", "qdq_onnx export (total)", parts)
    load = os.getloadavg()
    t0, c0 = time.perf_counter(), time.process_time()
    code = cli(["recipe", str(recipe), "--store", str(args.store)])
    files = {str(p.relative_to(args.store / "cache")): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted((args.store / "cache" / "export-qdq_onnx").rglob("*")) if p.suffix in (".onnx", ".data")}
    out = {"recipe": args.recipe, "component": args.component, "scheme": args.scheme, "exit_code": code,
           "source_sha256": running, "store_built_by_source_sha256": source,
           "threads": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OMNI_EXPORT_THREADS")},
           "load_average_before": load, "load_average_after": os.getloadavg(),
           "run": {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0},
           "parts": {k: {m: round(v, 2) if isinstance(v, float) else v for m, v in e.items()} for k, e in parts.items()},
           "qdq_files_sha256": files}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
