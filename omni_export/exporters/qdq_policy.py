"""A component's QDQ policy (``Component.qdq_policy``) applied to one fp32 source graph: which weights go to int16,
which nodes stay float (fp16 islands on the HTP), and the activation encodings several graphs must share.

The policy names layers by pattern, not by graph: the exporter resolves the patterns against the graph it
quantizes (its 1x1-conv weights and node types), so no exporter knows a model class. Keys (all optional):
- ``int16_weights``: weight names; ``int16_weight_match``: a regex over conv weight names, both to int16 per channel;
- ``float_ops``: ``"rmsnorm"`` (every ``SimplifiedLayerNormalization``) and/or ``"residual_add"`` (every Add whose
  result feeds an RMSNorm: the residual stream), left float, except a node reading a graph input or writing a
  graph output;
- ``float_outliers``: ``{"match": regex over conv weight names, "factor": f}``: each matching conv whose calibrated
  input absmax exceeds ``f`` x the median over the matching convs is left float (weights and op), decided from this
  build's own calibration ranges, and recorded with them;
- ``shared_kv``: each layer's cache input and new-row output (``k_cache_i``/``k_new_i``, ``v_...``) get one encoding.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

RMSNORM = "SimplifiedLayerNormalization"
FLOAT_OPS = ("rmsnorm", "residual_add")
KV_PAIR = re.compile(r"^([kv])_(?:cache|new)_(\d+)$")


def _graph(src: Path):
    import onnx
    return onnx.load(str(src), load_external_data=False).graph


def conv_weights(graph) -> dict[str, object]:
    """Conv weight name -> its Conv node."""
    inits = {t.name for t in graph.initializer}
    return {n.input[1]: n for n in graph.node if n.op_type == "Conv" and len(n.input) > 1 and n.input[1] in inits}


def float_op_nodes(graph, kinds) -> list[str]:
    bad = sorted(set(kinds) - set(FLOAT_OPS))
    if bad:
        raise ValueError(f"unknown float_ops {bad}; known: {list(FLOAT_OPS)}")
    consumers: dict[str, list] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    io = {i.name for i in graph.input} | {o.name for o in graph.output}
    names = []
    for n in graph.node:
        if io & {*n.input, *n.output}:
            # a graph input or output stays quantized: a part boundary keeps its one encoding, and a program
            # sharing a QNN context with a peer registers each IO tensor with the peer's (quantized) type
            continue
        if "rmsnorm" in kinds and n.op_type == RMSNORM:
            names.append(n.name)
        elif "residual_add" in kinds and n.op_type == "Add" and any(
                c.op_type == RMSNORM for c in consumers.get(n.output[0], [])):
            names.append(n.name)
    return names


def static_plan(src: Path, policy: dict | None) -> dict:
    """What the policy decides from the graph alone: ``{"int16": [...], "float_nodes": [...]}``."""
    policy = policy or {}
    g = _graph(src)
    convs = conv_weights(g)
    int16 = list(policy.get("int16_weights", []))
    if policy.get("int16_weight_match"):
        pat = re.compile(policy["int16_weight_match"])
        int16 += [w for w in convs if pat.search(w) and w not in int16]
    return {"int16": int16, "float_nodes": float_op_nodes(g, policy.get("float_ops", ()))}


def outlier_convs(src: Path, ranges: dict, rule: dict) -> tuple[list[str], dict]:
    """Conv nodes whose calibrated input absmax exceeds ``rule["factor"]`` x the median over the convs whose weight
    matches ``rule["match"]``; and the record (rule, every measured absmax, median, chosen)."""
    pat, factor = re.compile(rule["match"]), float(rule["factor"])
    absmax = {}
    for w, n in conv_weights(_graph(src)).items():
        if pat.search(w) and n.input[0] in ranges:
            lo, hi = ranges[n.input[0]]
            absmax[w] = max(abs(float(lo)), abs(float(hi)))
    if not absmax:
        return [], {"rule": rule, "input_absmax": {}, "chosen": []}
    median = float(np.median(list(absmax.values())))
    chosen = [w for w, a in absmax.items() if a > factor * median]
    nodes = {w: n.name for w, n in conv_weights(_graph(src)).items()}
    record = {"rule": f"conv weights matching {rule['match']!r} whose calibrated input absmax exceeds {factor:g} x "
                      "the median over them stay float (fp16 on the HTP)",
              "input_absmax": {w: round(a, 3) for w, a in absmax.items()}, "median_absmax": round(median, 3),
              "chosen": chosen}
    return [nodes[w] for w in chosen], record


def load_ranges(cache: Path) -> dict[str, tuple[float, float]]:
    from onnxruntime.quantization.calibrate import load_tensors_data
    return {k: (float(np.min(t.range_value[0])), float(np.max(t.range_value[1])))
            for k, t in load_tensors_data(Path(cache)).items()}


def shared_groups(graph_io: dict[str, tuple[list[str], list[str]]], shared_kv: bool) -> list[list[str]]:
    """Tensor names that must carry one encoding: a tensor one graph outputs and another takes as input (a part
    boundary), and with ``shared_kv`` each layer's cache input and new-row output."""
    ins = {n for i, _ in graph_io.values() for n in i}
    outs = {n for _, o in graph_io.values() for n in o}
    groups = [[t] for t in sorted(ins & outs)]
    if shared_kv:
        pairs: dict[tuple, list[str]] = {}
        for t in sorted(ins | outs):
            m = KV_PAIR.match(t)
            if m:
                pairs.setdefault(m.groups(), []).append(t)
        groups += [sorted(v) for v in pairs.values() if len(v) > 1]
    return groups


def shared_encodings(ranges: list[dict], groups: list[list[str]], activations: str) -> tuple[dict, dict]:
    """One (scale, zero point) per group from the union of every graph's calibrated range of its tensors, as ORT
    computes them (``compute_scale_zp``), as ORT tensor quant overrides (numpy float32 scale and unsigned zero
    point: onnxruntime 1.32 refuses Python numbers for activations) for every graph; and their record."""
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization.quant_utils import compute_scale_zp, get_qmin_qmax_for_qType
    qtype = {"uint16": QuantType.QUInt16, "uint8": QuantType.QUInt8}[activations]
    zdt = {"uint16": np.uint16, "uint8": np.uint8}[activations]
    qmin, qmax = get_qmin_qmax_for_qType(qtype.tensor_type)
    overrides, record = {}, {}
    for group in groups:
        seen = [r[t] for r in ranges for t in group if t in r]
        if not seen:
            continue
        lo, hi = np.float32(min(a for a, _ in seen)), np.float32(max(b for _, b in seen))
        zp, scale = compute_scale_zp(lo, hi, qmin, qmax)
        entry = {"scale": np.array(scale, np.float32), "zero_point": np.array(zp, zdt), "quant_type": qtype}
        for t in group:
            overrides[t] = [dict(entry)]
        record[",".join(group)] = {"scale": float(np.float32(scale)), "zero_point": int(zp),
                                   "range": [float(lo), float(hi)]}
    return overrides, record
