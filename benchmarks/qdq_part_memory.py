"""Wall time and peak RSS of one part's QDQ w8a16 build (fp32 ONNX export, its projections rewritten as 1x1 convs,
streaming min-max calibration, quantization), as the ``onnx`` and ``qdq_onnx`` targets run it, in one process. Uses (or captures) the recipe's calibration set in the
store, so a store from a full-size recipe run makes this a few minutes.

    python benchmarks/qdq_part_memory.py --preset full --store DIR --component decode_step --part 1
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from rich.console import Console

from omni_export import memory
from omni_export.artifacts.provenance import git_revision, toolchain
from omni_export.artifacts.store import Store, write_json_atomic
from omni_export.families import load_prompt_set
from omni_export.lowering.onnx_export import export_onnx
from omni_export.exporters.qdq_onnx import qdq_source
from omni_export.quantize.qdq import quantize_qdq
from omni_export.pipeline import Pipeline
from omni_export.recipes import load_recipe
from omni_export.schemes import get_scheme


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="spark_w8a16")
    ap.add_argument("--preset")
    ap.add_argument("--store", required=True)
    ap.add_argument("--component", default="decode_step")
    ap.add_argument("--part", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("qdq_part_memory.json"))
    a = ap.parse_args(argv)
    r = load_recipe(a.recipe).with_overrides(preset=a.preset)
    pipe = Pipeline(r, Store(Path(a.store)), Console(stderr=True))
    comp = pipe.load_components()[a.component]
    cal = pipe.calibration_set(comp, load_prompt_set(r.prompts.calibration))
    g = comp.graphs()[a.part]
    memory.reset_peak()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=a.store) as td:
        fp32 = export_onnx(g.module, g, Path(td) / "fp32.onnx")
        t1 = time.perf_counter()
        src = Path(td) / "rewritten.onnx"
        qdq_source(comp, g, get_scheme("w8a16"), src, fp32)
        comp.release_weights()
        t2, peak_export = time.perf_counter(), memory.peak_rss_bytes()
        quantize_qdq(src, Path(td) / "q.onnx", (comp.graph_feeds(f, g.name)[g.name] for f in cal), get_scheme("w8a16"))
    res = {"recipe": r.name, "preset": a.preset, "component": a.component, "graph": g.name,
           "export_s": round(t1 - t0, 1), "conv_rewrite_s": round(t2 - t1, 1),
           "calibrate_quantize_s": round(time.perf_counter() - t2, 1),
           "peak_rss_export_gib": round(peak_export / 2**30, 2), "peak_rss_gib": round(memory.peak_rss_bytes() / 2**30, 2),
           "calibration_samples": cal.samples, "toolchain": toolchain(), "source_revision": git_revision()}
    write_json_atomic(a.out, res)
    print({k: v for k, v in res.items() if k not in ("toolchain", "source_revision")})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
