"""A component's QDQ policy (``Component.qdq_policy``, a ``schemes.QdqPolicy``) applied to one fp32 source graph:
which weights go to int16, which nodes stay float (fp16 islands on the HTP), and the activation encodings several
graphs must share.

The policy names layers by pattern, not by graph: the exporter resolves the patterns against the graph it
quantizes (its 1x1-conv weights and node types), so no exporter knows a model class: ``static_plan`` decides what
the graph alone decides, ``outlier_convs`` what the calibrated ranges decide.

Not a policy but a rule of the target, for every uint16 build (``static_plan(..., activations)``): the second input
of a MatMul of two activations (attention's K^T and V) is int16 symmetric (``matmul_rhs_groups``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..schemes import FloatOutliers, QdqPolicy

RMSNORM = "SimplifiedLayerNormalization"
KV_PAIR = re.compile(r"^([kv])_(?:cache|new)_(\d+)$")


def _graph(src: Path):
    import onnx
    return onnx.load(str(src), load_external_data=False).graph


def conv_weights(graph) -> dict[str, object]:
    """Conv weight name -> its Conv node."""
    inits = {t.name for t in graph.initializer}
    return {n.input[1]: n for n in graph.node if n.op_type == "Conv" and len(n.input) > 1 and n.input[1] in inits}


def float_op_nodes(graph, kinds) -> list[str]:
    """The nodes of ``kinds`` (``QdqPolicy.float_ops``, checked there) to leave float."""
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


# ops that keep their input's encoding in onnxruntime's QDQ quantizer (``quantize_output_same_as_input``)
MOVES = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity"}


def matmul_rhs_groups(graph) -> list[list[str]]:
    """The tensors to quantize int16 symmetric so that the HTP multiplies two activations at 16 bits: the QNN EP
    converts an asymmetric uint16 second MatMul input to uint8 (one attention-score MatMul of SmolLM2's decode step,
    K^T of absmax 8.8: 34 dB against CPU-QDQ on the HTP simulator; a synthetic [3,3,64] x [3,64,129] MatMul:
    31.6 dB, the same as uint8; with int16 symmetric K: 68-69 dB; ``tests/quantize/test_matmul_rhs.py``). For each
    MatMul whose two inputs are activations: the tensor its second input is moved from (through ``MOVES``, which
    keep their input's encoding) and, when a Concat makes that tensor (a cache and its new row), the Concat's inputs:
    one group, one encoding."""
    consts = {t.name for t in graph.initializer} | {n.output[0] for n in graph.node if n.op_type == "Constant"}
    producer = {o: n for n in graph.node for o in n.output}
    groups = []
    for n in graph.node:
        if n.op_type != "MatMul" or len(n.input) != 2 or consts & set(n.input):
            continue
        t = moved_from(producer, n.input[1])[-1]
        p = producer.get(t)
        groups.append([t] + ([i for i in p.input if i not in consts] if p is not None and p.op_type == "Concat" else []))
    return merge_groups(groups)


def moved_from(producer: dict, t: str) -> list[str]:
    """``t`` and the tensors it is moved from through ``MOVES``, back to the one another op (or the graph) makes."""
    chain = [t]
    while chain[-1] in producer and producer[chain[-1]].op_type in MOVES:
        chain.append(producer[chain[-1]].input[0])
    return chain


def moved_new_rows(graph, groups) -> dict[str, tuple[str, str]]:
    """``source -> (move node, group tensor)`` for each Concat input of a ``matmul_rhs_groups`` group that is moved
    (through ``MOVES``) from a tensor another op makes: V's new row, a Reshape of v_proj's output. onnxruntime's
    quantizer gives a move's output its input's encoding, so the new row would keep the projection's uint16 one and
    the HTP would concatenate V in float and requantize the whole cache (40 % of a SmolLM2 decode step's cycles,
    ``quantize.readback``); the source is instead converted to the group's encoding for the move node alone (one
    requantization of the new row; the projection keeps its own output encoding: the HTP refuses a Conv with 16-bit
    weights writing int16 symmetric)."""
    producer = {o: n for n in graph.node for o in n.output}
    members = {t for g in groups for t in g}
    out = {}
    for t in sorted(members):
        p = producer.get(t)
        if p is None or p.op_type != "Concat":
            continue
        for i in p.input:
            chain = moved_from(producer, i)
            if len(chain) > 1 and chain[-1] not in members and chain[-1] in producer:
                out[chain[-1]] = (producer[chain[-2]].name, i)
    return out


def merge_groups(groups) -> list[list[str]]:
    """Groups that share a tensor, merged (sorted, in order of first appearance)."""
    merged: list[set] = []
    for g in groups:
        hit = [m for m in merged if m & set(g)]
        new = set(g).union(*hit)
        merged = [m for m in merged if not any(m is h for h in hit)] + [new]
    return sorted(sorted(m) for m in merged)


@dataclass
class Plan:
    """What a policy decides for one graph: the int16 weights, the nodes left float (``static_plan``, then the
    outlier convs ``outlier_convs`` adds from ranges), and the int16-symmetric MatMul input groups."""
    int16: list[str] = field(default_factory=list)
    float_nodes: list[str] = field(default_factory=list)
    rhs_int16: list[list[str]] = field(default_factory=list)
    rhs_converted: dict[str, tuple[str, str]] = field(default_factory=dict)  # ``moved_new_rows``


def static_plan(src: Path, policy: QdqPolicy | None, activations: str | None = None) -> Plan:
    """What the policy (and, for ``activations`` uint16, the HTP's MatMul rule) decides from the graph alone."""
    g = _graph(src)
    plan = Plan(rhs_int16=matmul_rhs_groups(g) if activations == "uint16" else [])
    plan.rhs_converted = moved_new_rows(g, plan.rhs_int16)
    if policy is not None:
        plan.int16 = list(policy.int16_weights)
        if policy.int16_weight_match:
            pat = re.compile(policy.int16_weight_match)
            plan.int16 += [w for w in conv_weights(g) if pat.search(w) and w not in plan.int16]
        plan.float_nodes = float_op_nodes(g, policy.float_ops)
    return plan


def outlier_convs(src: Path, ranges: dict, rule: FloatOutliers) -> tuple[list[str], dict]:
    """Conv nodes whose calibrated input absmax exceeds ``rule.factor`` x the median over the convs whose weight
    matches ``rule.match``; and the record (rule, every measured absmax, median, chosen)."""
    pat, factor = re.compile(rule.match), float(rule.factor)
    absmax, convs = {}, conv_weights(_graph(src))
    for w, n in convs.items():
        if pat.search(w) and n.input[0] in ranges:
            lo, hi = ranges[n.input[0]]
            absmax[w] = max(abs(float(lo)), abs(float(hi)))
    if not absmax:
        return [], {"rule": {"match": rule.match, "factor": factor}, "input_absmax": {}, "chosen": []}
    median = float(np.median(list(absmax.values())))
    chosen = [w for w, a in absmax.items() if a > factor * median]
    names = [convs[w].name for w in chosen]
    record = {"rule": f"conv weights matching {rule.match!r} whose calibrated input absmax exceeds {factor:g} x "
                      "the median over them stay float (fp16 on the HTP)" +
                      (", with the op computing the input and the moves laying it in and out" if rule.with_input
                       else ""),
              "input_absmax": {w: round(a, 3) for w, a in absmax.items()}, "median_absmax": round(median, 3),
              "chosen": chosen}
    if rule.with_input:
        g = _graph(src)
        producer, consumers = {o: n for n in g.node for o in n.output}, {}
        for n in g.node:
            for i in n.input:
                consumers.setdefault(i, []).append(n)
        inputs = [[producer[t].name for t in moved_from(producer, convs[w].input[0]) if t in producer] +
                  moves_after(consumers, convs[w].output[0]) for w in chosen]
        record["float_layout"] = dict(zip(chosen, inputs))
        names += [n for ns in inputs for n in ns]
    return names, record


def moves_after(consumers: dict, t: str) -> list[str]:
    """The ``MOVES`` nodes ``t`` flows through (``consumers``: tensor -> the nodes reading it), each the only reader
    of the one before (a conv's output laid back out as rows)."""
    out = []
    while len(consumers.get(t, [])) == 1 and consumers[t][0].op_type in MOVES:
        out.append(consumers[t][0].name)
        t = consumers[t][0].output[0]
    return out


def load_ranges(cache: Path) -> dict[str, tuple[float, float]]:
    from onnxruntime.quantization.calibrate import load_tensors_data
    return {k: (float(np.min(t.range_value[0])), float(np.max(t.range_value[1])))
            for k, t in load_tensors_data(Path(cache)).items()}


def shared_groups(graph_io: dict[str, tuple[list[str], list[str]]], shared_kv: bool, extra=()) -> list[list[str]]:
    """Tensor names that must carry one encoding: a tensor one graph outputs and another takes as input (a part
    boundary), with ``shared_kv`` each layer's cache input and new-row output, and the ``extra`` groups (graph IO
    names only), merged where they meet."""
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
    return merge_groups(groups + [list(g) for g in extra]) if extra else groups


def shared_encodings(ranges: list[dict], groups: list[list[str]], activations: str, symmetric=()) -> tuple[dict, dict]:
    """One (scale, zero point) per group from the union of every graph's calibrated range of its tensors, as ORT
    computes them (``compute_scale_zp``), as ORT tensor quant overrides (numpy float32 scale and zero point of the
    quantized type: onnxruntime 1.32 refuses Python numbers for activations) for every graph; and their record.
    A group with a tensor in ``symmetric`` is int16 symmetric (zero point 0: ``matmul_rhs_groups``)."""
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization.quant_utils import compute_scale_zp, get_qmin_qmax_for_qType
    overrides, record = {}, {}
    for group in groups:
        seen = [r[t] for r in ranges for t in group if t in r]
        if not seen:
            continue
        sym = bool(set(group) & set(symmetric))
        qtype = QuantType.QInt16 if sym else {"uint16": QuantType.QUInt16, "uint8": QuantType.QUInt8}[activations]
        zdt = np.int16 if sym else {"uint16": np.uint16, "uint8": np.uint8}[activations]
        qmin, qmax = get_qmin_qmax_for_qType(qtype.tensor_type, symmetric=sym)
        lo, hi = np.float32(min(a for a, _ in seen)), np.float32(max(b for _, b in seen))
        zp, scale = compute_scale_zp(lo, hi, qmin, qmax, symmetric=sym)
        entry = {"scale": np.array(scale, np.float32), "zero_point": np.array(zp, zdt), "quant_type": qtype}
        for t in group:
            overrides[t] = [dict(entry)]
        record[",".join(group)] = {"scale": float(np.float32(scale)), "zero_point": int(zp),
                                   "range": [float(lo), float(hi)], **({"type": "int16 symmetric"} if sym else {})}
    return overrides, record


def rhs_overrides(groups, shared: dict, ranges: dict | None, activations: str, converted=None) -> dict:
    """ORT overrides for one graph's ``matmul_rhs_groups``: a group with a tensor in ``shared`` (a cache input, whose
    encoding every graph shares) takes that encoding whole; another its own int16 symmetric one from this graph's
    ``ranges``; without ranges (an uncalibrated build) each tensor int16 symmetric from the quantizer's range. Each
    source of ``converted`` (``moved_new_rows``) is converted to its group's encoding for its move node alone (an
    ORT ``convert`` override, merged into what the quantizer gives the source itself)."""
    from onnxruntime.quantization import QuantType
    out = _rhs_group_overrides(groups, shared, ranges, activations, QuantType)
    for src, (node, member) in (converted or {}).items():
        if member in out:
            out[src] = [{"convert": {**out[member][0], "recv_nodes": {node}}}]
    return out


def _rhs_group_overrides(groups, shared, ranges, activations, QuantType) -> dict:
    out = {}
    for g in groups:
        known = [t for t in g if t in shared]
        if known:
            out.update({t: shared[known[0]] for t in g})
        elif ranges is not None:
            out.update(shared_encodings([ranges], [g], activations, symmetric=g)[0])
        else:
            out.update({t: [{"quant_type": QuantType.QInt16, "symmetric": True}] for t in g})
    return out
