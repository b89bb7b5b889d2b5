"""Bytes across the graph boundary and ORT-CPU latency per decode step: new-rows-only vs window hand-back.

Our layout: caches go in, only the new K/V row of each layer comes out; the host writes it into a ring buffer.
Window hand-back (what the first on-device build did): every sliding layer returns its whole updated window.
Both are exported from the same Spark-X2.5 layers (full-size widths, one 3:1 period of layers by default) and run on
ONNX Runtime CPU. Usage:

    python benchmarks/kv_layout.py [--layers 4] [--contexts 1024 4096] [--steps 30] [--out benchmarks/results/kv_layout.json]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from omni_export.artifacts.provenance import git_revision, toolchain
from omni_export.components.base import Graph
from omni_export.components.decoder_lm import DecodeStepComponent
from omni_export.lowering.onnx_export import export_onnx
from omni_export.families import ModelBundle, get_family
from omni_export.families.spark.model import FULL, PRESETS, SparkForCausalLM, init_random
from omni_export.runtimes.ort import cpu_session


class WindowHandBack(torch.nn.Module):
    """The same step, but each sliding layer hands its whole updated window back (oldest row dropped)."""

    def __init__(self, step):
        super().__init__()
        self.step = step
        self.sliding = [i for i, t in enumerate(step.cfg.layer_types) if t != FULL]

    def forward(self, *inputs):
        env = dict(zip(self.step.input_names, inputs))
        outs = list(self.step(*inputs))
        for i in self.sliding:
            for j, kv in ((1 + 2 * i, "k"), (2 + 2 * i, "v")):
                outs[j] = torch.cat((env[f"{kv}_cache_{i}"][:, :, 1:], outs[j]), dim=2)
        return tuple(outs)


def nbytes(specs) -> int:
    return int(sum(np.prod(s.shape) * 4 for s in specs))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", default="benchmarks/results/kv_layout.json")
    a = ap.parse_args()
    cfg = dataclasses.replace(PRESETS["full"], num_hidden_layers=a.layers, layer_types=(), vocab_size=4096)
    fam = get_family("spark")
    lm = init_random(SparkForCausalLM(cfg), 0).eval()
    bundle = ModelBundle(fam, lm, cfg, "seeded random (benchmark)", "-", "-", tokenizer=fam.make_tokenizer(cfg))
    results = []
    for ctx in a.contexts:
        comp = DecodeStepComponent(bundle, ctx)
        g = comp.graphs()[0]
        hb_out = []
        for s in g.outputs:
            i = int(s.name.rsplit("_", 1)[1]) if "_new_" in s.name else None
            if i is not None and cfg.layer_types[i] != FULL:
                s = dataclasses.replace(s, shape=(1, cfg.num_key_value_heads, comp.cache_len(cfg.layer_types[i]), cfg.head_dim))
            hb_out.append(s)
        layouts = {"new_rows": g, "window_handback": Graph("model", WindowHandBack(comp.module), g.inputs, tuple(hb_out))}
        feed = {s.name: np.random.RandomState(0).standard_normal(s.shape).astype(np.float32) * 0.1 for s in g.inputs}
        feed.update(comp.feed(comp.new_caches(), 5, min(ctx - 1, 700)))
        for k in feed:
            if "_cache_" in k:
                feed[k] = np.random.RandomState(1).standard_normal(feed[k].shape).astype(np.float32)
        with tempfile.TemporaryDirectory() as tmp:
            for name, graph in layouts.items():
                path = export_onnx(graph.module, graph, Path(tmp) / f"{name}.onnx")
                sess = cpu_session(path)
                for _ in range(3):
                    sess.run(None, feed)
                times = []
                for _ in range(a.steps):
                    t = time.perf_counter()
                    sess.run(None, feed)
                    times.append(time.perf_counter() - t)
                results.append({"context": ctx, "layout": name, "layers": a.layers,
                                "bytes_in": nbytes(graph.inputs), "bytes_out": nbytes(graph.outputs),
                                "ms_per_step_median": round(1000 * statistics.median(times), 3),
                                "ms_per_step_min": round(1000 * min(times), 3)})
                print(json.dumps(results[-1]))
                del sess
    summary = []
    for ctx in a.contexts:
        nr = next(r for r in results if r["context"] == ctx and r["layout"] == "new_rows")
        hb = next(r for r in results if r["context"] == ctx and r["layout"] == "window_handback")
        summary.append({"context": ctx, "bytes_out_ratio_handback_over_new_rows": round(hb["bytes_out"] / nr["bytes_out"], 1),
                        "bytes_total_ratio": round((hb["bytes_in"] + hb["bytes_out"]) / (nr["bytes_in"] + nr["bytes_out"]), 3),
                        "latency_ratio_handback_over_new_rows": round(hb["ms_per_step_median"] / nr["ms_per_step_median"], 3)})
    out = {"benchmark": "kv_layout", "config": {"hidden": cfg.hidden_size, "head_dim": cfg.head_dim,
                                                "kv_heads": cfg.num_key_value_heads, "window": cfg.sliding_window,
                                                "layers": a.layers, "layer_types": list(cfg.layer_types)},
           "results": results, "summary": summary, "toolchain": toolchain(), "source_revision": git_revision(),
           "note": "wall times on a 2-core machine; other processes may have been running"}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
