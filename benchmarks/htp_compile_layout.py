"""HTP context-binary compile time of one full-size Spark-X2.5 layer, by row count and by the 1x1-conv layout.

Projections go to the NPU as 1x1 convs (``rewrites.LinearAsConv``). With N rows the conv input can carry the rows as
its batch, [N, in, 1, 1], or as its width, [1, in, 1, N] (what ``LinearAsConv`` does). Both compute the same; this
script builds one layer (random weights, calibrated on random inputs, w8a16 QDQ) for each row count and layout,
compiles it for the named SoC with the QNN HTP backend (prepare-only, as the ``qnn_context`` target does) and records
the export, quantization and compile times, as JSON with provenance.

    python benchmarks/htp_compile_layout.py --rows 1,32,128 --out benchmarks/results/htp_compile_layout.json
"""
from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from omni_export.artifacts.provenance import git_revision, toolchain
from omni_export.artifacts.store import write_json_atomic
from omni_export.components.base import Graph, TensorSpec
from omni_export.devices import get_device
from omni_export.lowering.onnx_export import export_onnx
from omni_export.quantize.qdq import quantize_qdq
from omni_export.blocks.graph_forms import LinearAsConv, linear_to_conv
from omni_export.components.decode_graph import DecodeStep
from omni_export.families.spark.model import FULL, PRESETS, SLIDING, SparkForCausalLM, init_random
from omni_export.runtimes.ort import htp_session
from omni_export.schemes import get_scheme


class RowsAsBatch(LinearAsConv):
    """The other layout, for comparison only: rows as the conv's batch, [N, in, 1, 1]."""

    def forward(self, x):
        lead = x.shape[:-1]
        return self.conv(x.reshape(-1, x.shape[-1], 1, 1)).reshape(*lead, self.out_features)


def layer_graph(layer_type: str, rows: int, context: int) -> Graph:
    """The first of two full-size layers as a non-final part (no LM head); small vocabulary (the embedding is unused)."""
    cfg = dataclasses.replace(PRESETS["full"], num_hidden_layers=2, layer_types=(layer_type, layer_type),
                              vocab_size=256)
    lm = init_random(SparkForCausalLM(cfg), 0)
    step = DecodeStep(lm, context, 0, 1)
    tag = "full" if layer_type == FULL else "sliding"
    cache = context if layer_type == FULL else cfg.sliding_window - 1
    nkv, hd, rot = cfg.num_key_value_heads, cfg.head_dim, cfg.rotary_dim(layer_type)
    shapes = {"embeds": (1, rows, cfg.hidden_size), f"cos_{tag}": (1, 1, rows, rot), f"sin_{tag}": (1, 1, rows, rot),
              f"mask_{tag}": (1, 1, rows, cache + rows), "k_cache_0": (1, nkv, cache, hd),
              "v_cache_0": (1, nkv, cache, hd)}
    outs = {"hidden_1": (1, rows, cfg.hidden_size), "k_new_0": (1, nkv, rows, hd), "v_new_0": (1, nkv, rows, hd)}
    return Graph(f"layer_{tag}_{rows}", step, tuple(TensorSpec(n, shapes[n]) for n in step.input_names),
                 tuple(TensorSpec(n, outs[n]) for n in step.output_names))


def measure(g: Graph, layout: str, device, work: Path) -> dict:
    module = linear_to_conv(g.module)
    if layout == "batch":
        for m in module.modules():
            if isinstance(m, LinearAsConv):
                m.__class__ = RowsAsBatch
    t0 = time.perf_counter()
    src = export_onnx(module, g, work / "fp32.onnx")
    t1 = time.perf_counter()
    rs = np.random.RandomState(0)
    feeds = [{s.name: (np.zeros(s.shape) if s.name.startswith("mask") else rs.standard_normal(s.shape))
              .astype(np.float32) for s in g.inputs} for _ in range(2)]
    quantize_qdq(src, work / "qdq.onnx", iter(feeds), get_scheme("w8a16"))
    t2 = time.perf_counter()
    htp_session(work / "qdq.onnx", device, context_out=work / "ctx.onnx")
    t3 = time.perf_counter()
    return {"export_s": round(t1 - t0, 1), "quantize_s": round(t2 - t1, 1), "htp_compile_s": round(t3 - t2, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,32,128", help="comma-separated row counts")
    ap.add_argument("--layouts", default="width,batch")
    ap.add_argument("--layer-type", choices=(SLIDING, FULL), default=SLIDING)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--device", default="galaxy_s25")
    ap.add_argument("--out", type=Path, default=Path("htp_compile_layout.json"))
    a = ap.parse_args(argv)
    torch.set_num_threads(2)
    device = get_device(a.device)
    rows = []
    for n in (int(r) for r in a.rows.split(",")):
        g = layer_graph(a.layer_type, n, a.context)
        for layout in a.layouts.split(","):
            with tempfile.TemporaryDirectory(prefix="omni-htp-layout-") as td:
                r = {"rows": n, "layout": layout, **measure(g, layout, device, Path(td))}
            print(r, flush=True)
            rows.append(r)
    res = {"what": "one full-size Spark-X2.5 layer, w8a16 QDQ, HTP context compile (prepare-only)",
           "layer_type": a.layer_type, "context": a.context, "device": dataclasses.asdict(device), "results": rows,
           "toolchain": toolchain(), "source_revision": git_revision()}
    write_json_atomic(a.out, res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
