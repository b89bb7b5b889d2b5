"""Batched calibration: the min-max pass (and the scale search's Gram matrices) over a copy of the graph exported
with a batch of B samples per call.

At batch 1 a decode step reads every weight once per sample: on SmolLM2 (540 MB of fp32 weights) a call of the
calibration graph takes 42 ms on one core, bound by memory, and the shipped 1,024 samples take 43 s; 16 samples in
one call take 100 ms (6 ms each). Min and max are exact under any grouping, so the ranges are the samples' own (up
to the last bit a batched matmul may round differently); the Gram matrices sum the same rows in the same order.

The copy is the component's module exported again with the leading dimension of every input and output set to B,
through the same rewrites as the batch-1 source (``qdq_onnx.batched_source``). The exporter names tensors after
the module's ops, so every tensor calibrated in the batch-1 graph has its name in the copy; ``matching`` checks
that each holds exactly B times its elements before the copy is used, and the first batched call must give every
tensor the range the batch-1 graph gives the same samples (``minmax_pass``), else the pass runs at batch 1. A component
opts in with ``Component.calibration_batch`` (its graphs compute each row along dim 0 on its own: a decode step);
the copy is exported only when the pass runs (a memoized pass reads its ranges) and only where reading weights is
what a call costs (``batch_size``)."""
from __future__ import annotations

import dataclasses
import math

import numpy as np

BATCH_INPUT_BYTES = 128 << 20  # one batched call's inputs at most (a full-size decode part's caches: ~70 MB a sample)
MIN_WEIGHT_BYTES = 64 << 20    # a smaller graph's call is not bound by reading weights: batching would not repay
MIN_CALLS = 24                 # the export (19-28 s for SmolLM2's step on one core); nor with fewer than this many
# batched calls: at 32 (Gemma 3's 512 samples) batching measured 83.1 s of QDQ export against 87.6 s one sample a
# call, about even; the naive SmolLM2 row's 128 samples (8 calls) run one a call
# the batched copy's first call must give each tensor the range the batch-1 graph gives the same samples to within
# this fraction of the tensor's largest magnitude (a batched matmul rounds differently: ~1e-6 seen on SmolLM2); a
# graph that mixes the rows of a batch misses it by far
FIRST_CALL_RTOL = 1e-3


def batch_size(comp, graph, weight_bytes: int, samples: int) -> int:
    """Samples per call of ``graph``'s calibration pass: the component's ``calibration_batch``, within
    ``BATCH_INPUT_BYTES`` of inputs; 1 where the graph's weights are under ``MIN_WEIGHT_BYTES`` or the samples would
    make fewer than ``MIN_CALLS`` batched calls."""
    b = int(getattr(comp, "calibration_batch", 1) or 1)
    per = sum(4 * math.prod(s.shape) for s in graph.inputs)
    b = min(b, max(1, BATCH_INPUT_BYTES // max(per, 1)))
    if b < 2 or weight_bytes < MIN_WEIGHT_BYTES or samples < MIN_CALLS * b:
        return 1
    return b


def batched_graph(graph, batch: int):
    """``graph`` with the leading dimension of every input and output (1 at batch 1) set to ``batch``."""
    for s in (*graph.inputs, *graph.outputs):
        if not s.shape or s.shape[0] != 1:
            raise ValueError(f"graph {graph.name}: {s.name} {s.shape} has no leading batch dimension of 1")

    def at(s):
        return dataclasses.replace(s, shape=(batch, *s.shape[1:]))
    return dataclasses.replace(graph, inputs=tuple(map(at, graph.inputs)), outputs=tuple(map(at, graph.outputs)))


def _numel(vi) -> int | None:
    dims = vi.type.tensor_type.shape.dim if vi.type.tensor_type.HasField("shape") else None
    if not dims or not all(d.HasField("dim_value") for d in dims):
        return None
    return math.prod(d.dim_value for d in dims)


def matching(chosen, value_infos: dict, batched_infos: dict, batch: int) -> str | None:
    """None when every tensor of ``chosen`` is in the batched graph with ``batch`` times its batch-1 elements, else
    the first that is not (the reason the pass stays at batch 1)."""
    for t in sorted(chosen):
        n1 = _numel(value_infos[t]) if t in value_infos else None
        nb = _numel(batched_infos[t]) if t in batched_infos else None
        if n1 is None or nb != batch * n1:
            return f"tensor {t}: {n1} elements at batch 1, {nb} at batch {batch}"
    return None


def batches(reader, batch: int, rest: list):
    """Feeds of ``batch`` samples each from ``reader`` (inputs stacked along dim 0); the samples left over at the
    end (fewer than ``batch``) go to ``rest``, in order, for the batch-1 graph."""
    group = []
    while (feed := reader.get_next()) is not None:
        group.append(feed)
        if len(group) == batch:
            yield {k: np.concatenate([f[k] for f in group], axis=0) for k in group[0]}
            group = []
    rest.extend(group)
