"""The ``genie`` target's quantized bundles: the Genie-form graphs (``components.decoder_genie``) quantized as the
``qdq_onnx`` target quantizes the decode step, under the component's Genie policy (``GenieForm.qdq_policy``), then
compiled to QNN HTP context binaries whose IO stays float32 (the graph quantizes inside).

- token generator (AR-1): the decode step's own policy (for ``w8a16`` int16 down/v/head weights, searched int8
  scales, widened ranges), calibrated on the decode step's sink-free calibration set fed as Genie feeds it;
- prompt processor (AR-N): the program that computes position 0 (the attention sink) in Genie, since Genie sends
  every prompt through it: calibrated on Genie's own calls over the calibration prompts, row 0 included, with the
  AR-1 weights' encodings (one set for both programs; for ``w8a16``: ``decoder_qdq.genie_prompt_qdq_policy``).

IO: float32 in and out, so Genie's own values are what the graph reads: its 0 / -1000 mask, its cos/sin and the K/V
bytes it copies from ``past_*_out`` to ``past_*_in``. Inside, each input is quantized by the graph's first
QuantizeLinear; each ``past_*_out`` is written in the encoding its ``past_*_in`` is read with
(``write_outputs_in_input_encoding``), so a row Genie copies back re-quantizes to the same code it was written with.
The encodings are read back from the built graph into the manifest (``io_encodings``)."""
from __future__ import annotations

import re
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..errors import CalibrationError, UnsupportedError
from ..lowering.onnx_export import export_onnx
from ..lowering.onnx_rewrites import matmul_as_conv
from ..lowering.parallel import PartPool
from ..runtimes import RuntimeUnavailable
from ..runtimes.ort import htp_session
from .part import QdqPart
from .policy import MOVES, load_ranges, merge_groups, shared_encodings, static_plan

GENIE_KV = re.compile(r"^past_(key|value)_(\d+)_(in|out)$")
IO_NOTE = ("float32 IO (mask, cos/sin, K/V, logits; input_ids int32): Genie writes and reads plain float32 values, "
           "the graph quantizes them inside with the encodings below; each past_*_out is written in the encoding its "
           "past_*_in is read with, so a K/V row Genie copies back re-quantizes to the code it was written with (the "
           "Where zeroing unwritten slots and the transposes before a cache's first QuantizeLinear run in float)")


def io_groups(graphs) -> list[list[str]]:
    """Each layer's ``[past_{kv}_{i}_in, past_{kv}_{i}_out]`` (Genie copies the one into the other:
    ``write_outputs_in_input_encoding``), and ``[t]`` for a tensor one part outputs and the next reads (``hidden_*``:
    one shared encoding)."""
    ins = {s.name for g in graphs for s in g.inputs}
    outs = {s.name for g in graphs for s in g.outputs}
    pairs: dict[tuple, list[str]] = {}
    for t in sorted(ins | outs):
        m = GENIE_KV.match(t)
        if m:
            pairs.setdefault(m.groups()[:2], []).append(t)
    return [sorted(v) for v in pairs.values() if len(v) > 1] + [[t] for t in sorted(ins & outs)]


def quantize_graphs(form, variants: dict, scheme, calibration, work: Path,
                    prompt_ids: list[list[int]] | None = None) -> tuple[dict[str, Path], dict]:
    """Each Genie-form graph of ``variants`` ({AR: the variant's parts}) quantized to ``work/<name>.qdq.onnx``; returns
    (paths, record). One set of weight encodings for every variant: the AR-1 parts search their int8 weight scales
    on the decode step's calibration set (the positions of the calibration prompts, which the AR-N graph's rows
    compute, and of their continuations, which AR-1 computes) and each AR-N part takes the scales of the AR-1 part of
    the same layers. AR-1 calibrates its activations on those samples fed as Genie feeds it; AR-N, the program that
    computes position 0 (the attention sink) in Genie, on Genie's own calls over the calibration prompts
    ``prompt_ids`` (``GenieForm.calibration_feeds``), under its own policy (``GenieForm.qdq_policy``). The weight
    encodings of the built graphs are compared: a difference is an error (``weight_encodings``)."""
    if scheme.calibrated and calibration is None:
        raise CalibrationError(f"scheme {scheme.name} is calibrated but no calibration set was given")
    if not scheme.calibrated:
        raise UnsupportedError(f"target genie: scheme {scheme.name} is uncalibrated: a Genie-form graph has no random "
                               "stand-in inputs (its mask, token ids and caches follow Genie's contract)")
    parts, token = [], {}
    for ar in sorted(variants):  # AR-1 first: its searched weight scales are every variant's
        for k, g in enumerate(variants[ar]):
            d = work / f".qdq-{g.name}"
            d.mkdir()
            fp32 = export_onnx(g.module, g, d / "fp32.onnx", fuse_norms=scheme.fused_norm)
            form.release()
            src = d / "rewritten.onnx"
            matmul_as_conv(fp32, src)
            policy = form.qdq_policy(g.name, g.module, scheme)
            if ar != 1 and policy is not None and policy.weight_scales == "mse":  # AR-1's scales, not searched again
                policy = replace(policy, weight_scales="shared", scales_from=variants[1][k].name)
            part = QdqPart(g, src, work / f"{g.name}.qdq.onnx", policy, static_plan(src, policy, scheme.activations))
            part.calibrate(form.calibration_feeds(calibration, variants[ar], g.name, prompt_ids), scheme)
            if ar == 1:
                token[k] = part
            elif token[k].searched is not None:
                part.searched = token[k].searched
            parts.append(part)
    graphs = [g for gs in variants.values() for g in gs]
    of = {ar: [p for p in parts if p.graph.name in {g.name for g in gs}] for ar, gs in variants.items()}  # AR -> parts
    caches = share_cache_ranges(of[1], {ar: ps for ar, ps in of.items() if ar != 1})
    rhs = [grp for p in parts for grp in p.rhs_io()]
    boundaries = [grp for grp in io_groups(graphs) if len(grp) == 1]  # hidden_*: one part writes, the next reads
    shared, record = shared_encodings([load_ranges(p.cache) for p in parts], merge_groups(boundaries + rhs),
                                      scheme.activations, {t for grp in rhs for t in grp})
    with PartPool(len(parts), None) as pool:
        for p in parts:
            p.submit(pool, (), scheme, shared)
    aligned = {p.graph.name: write_outputs_in_input_encoding(p.dst, kv_io_pairs(io_groups([p.graph]))) for p in parts}
    one_set = same_weight_encodings({ar: [p.dst for p in ps] for ar, ps in of.items()})
    info = {"component_policy": {p.graph.name: p.record() for p in parts if p.policy},
            "shared_encodings": record,
            "kv_out_requantized": {g: v for g, v in aligned.items() if v},
            "float_nodes": {p.graph.name: len(p.plan.float_nodes) for p in parts if p.plan.float_nodes},
            "activation_ranges": {
                "token generator (AR-1)": f"calibration set {calibration.hash[:12]} (the decode step's, sink-free), "
                                          "fed as Genie feeds it",
                **{f"prompt processor (AR-{ar})": f"Genie's calls over the {len(prompt_ids)} calibration prompts of "
                                                   f"set {calibration.prompt_set} (position 0, the attention sink, "
                                                   "included)" for ar in variants if ar != 1 and prompt_ids}},
            "weight_encodings": f"one set for {len(variants)} program(s): {one_set}"}
    if caches:
        info["shared_encodings"]["K/V cache groups of every program"] = caches
    return {p.graph.name: p.dst for p in parts}, info


def share_cache_ranges(token: list, others: dict[int, list]) -> str | None:
    """Give each int16 K/V group (``rhs_int16``: a cache, its new row and what the attention MatMul reads) that the
    AR-1 part and the AR-N part of the same layers both have the union of their calibrated ranges, in both parts'
    range files: Genie keeps one cache for both programs, so a row one writes the other reads in the same encoding.
    A group one part has and the other not is an error. Returns what was shared."""
    from onnxruntime.quantization.calibrate import TensorData, load_tensors_data, save_tensors_data
    n = 0
    for k, ref in enumerate(token):
        for part in (ps[k] for ps in others.values()):
            if sorted(map(sorted, ref.plan.rhs_int16)) != sorted(map(sorted, part.plan.rhs_int16)):
                raise CalibrationError(f"genie: {part.graph.name} and {ref.graph.name} differ in their K/V groups: "
                                       "one cache encoding for both programs cannot be chosen")
            a, b = load_tensors_data(ref.cache), load_tensors_data(part.cache)
            for t in {t for grp in ref.plan.rhs_int16 for t in grp}:
                if t not in a.data and t not in b.data:  # a constant in the group (a tied LM head's weight): no range
                    continue
                if t not in a.data or t not in b.data:
                    raise CalibrationError(f"genie: {t} has a calibrated range in one of {ref.graph.name} and "
                                           f"{part.graph.name} only: one cache encoding cannot be chosen")
                lo = np.minimum(a[t].range_value[0], b[t].range_value[0])
                hi = np.maximum(a[t].range_value[1], b[t].range_value[1])
                a[t] = b[t] = TensorData(lowest=lo, highest=hi)
                n += 1
            save_tensors_data(a, ref.cache)
            save_tensors_data(b, part.cache)
    return f"{n} K/V group tensors: the union of the programs' calibrated ranges" if n else None


def weight_encodings(qdq: Path) -> dict[str, tuple]:
    """Each quantized constant of the QDQ graph ``qdq``: ``{initializer: (its bytes' hash, scale bytes, zero point
    bytes, type)}``."""
    import hashlib

    import onnx
    from onnx import numpy_helper

    g = onnx.load(str(qdq), load_external_data=False).graph
    consts = {t.name: t for t in g.initializer}
    out = {}
    for n in g.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear") and n.input[0] in consts:
            scale, zp = (numpy_helper.to_array(consts[i], str(Path(qdq).parent)) for i in n.input[1:3])
            w = numpy_helper.to_array(consts[n.input[0]], str(Path(qdq).parent))
            data = hashlib.blake2b(w.tobytes(), digest_size=16).digest()
            out[n.input[0]] = (data, scale.tobytes(), zp.tobytes(), str(zp.dtype))
    return out


def same_weight_encodings(variants: dict[int, list[Path]]) -> str:
    """Check that the QDQ graphs of every variant (``{AR: part paths}``, part k of each holding the same layers)
    quantize each weight alike; a difference is a ``CalibrationError``. Returns what was compared."""
    ars = sorted(variants)
    n = 0
    for k, ref in enumerate(variants[ars[0]]):
        want = weight_encodings(ref)
        for ar in ars[1:]:
            got = weight_encodings(variants[ar][k])
            differ = sorted(w for w in set(want) | set(got) if want.get(w) != got.get(w))
            if differ:
                raise CalibrationError(f"genie: AR-{ar} and AR-{ars[0]} quantize {len(differ)} weights differently "
                                       f"(e.g. {differ[0]}): the programs would not share one set of weight encodings")
        n += len(want)
    return (f"{n} quantized weights, identical scales and zero points in AR-" + " and AR-".join(map(str, ars)) +
            " (compared after quantization)")


def _first_quantize(g, name: str):
    """The QuantizeLinear graph input ``name`` first reaches (through ``MOVES`` and the ``Where`` that zeroes unwritten
    slots, which run float), or None."""
    consumers: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    t = name
    while len(consumers.get(t, [])) == 1 and consumers[t][0].op_type in MOVES | {"Where"}:
        t = consumers[t][0].output[0]
    q = [c for c in consumers.get(t, []) if c.op_type == "QuantizeLinear"]
    return q[0] if q else None


def kv_io_pairs(groups: list[list[str]]) -> list[tuple[str, str]]:
    """``(past_*_in, past_*_out)`` of each two-tensor group of ``io_groups``."""
    return [tuple(sorted(g, key=lambda t: not t.endswith("_in"))) for g in groups if len(g) == 2]


def write_outputs_in_input_encoding(qdq: Path, pairs: list[tuple[str, str]]) -> list[str]:
    """Rewrite the QDQ graph ``qdq`` so that the output of each ``(input, output)`` K/V pair (Genie's ``past_*_in``,
    ``past_*_out``) is quantized with the encoding its input is first quantized with (onnxruntime's quantizer gives
    an output the encoding of the op making it, which for V rows is not the one the cache input gets): the float
    row the runtime copies from out to in then re-quantizes to the code it was written with. Returns the outputs
    rewritten."""
    import onnx

    m = onnx.load(str(qdq), load_external_data=False)
    g = m.graph
    producer = {o: n for n in g.node for o in n.output}
    done = []
    for t_in, t_out in pairs:
        q_in, dq = _first_quantize(g, t_in), producer.get(t_out)
        if q_in is None or dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in producer:
            continue
        q = producer[dq.input[0]]
        if q.op_type != "QuantizeLinear" or list(q.input[1:3]) == list(q_in.input[1:3]):
            continue
        q.input[1], q.input[2] = q_in.input[1], q_in.input[2]
        dq.input[1], dq.input[2] = q_in.input[1], q_in.input[2]
        done.append(t_out)
    if done:
        for vi in list(g.value_info):  # the rewritten tensors' integer type follows the new zero point
            if vi.name in {producer[t].input[0] for t in done}:
                g.value_info.remove(vi)
        tmp = qdq.with_name(qdq.name + ".tmp")
        onnx.save(m, str(tmp))
        tmp.replace(qdq)
    return done


# QNN's graph finalization for SM8750 fails to allocate on some mixed graphs (SmolLM2's AR-32 prompt processor with
# fp16 islands: QNN_COMMON_ERROR_MEM_ALLOC at the default mode and at modes 2 and 3, measured); mode 1 (faster
# preparation, a less optimized schedule) finalizes it. Mode 1 changes the HTP schedule, not the graph's arithmetic.
FINALIZE_FALLBACK = {"htp_graph_finalization_optimization_mode": "1"}
FINALIZE_ERROR = "QNN_COMMON_ERROR_MEM_ALLOC"


def compile_float_io(src: Path, device, fp16: bool, ctx: Path) -> str | None:
    """``src`` (a QDQ graph with float32 IO) compiled to a context binary ``ctx`` whose QNN graph keeps that float32
    IO (``offload_graph_io_quantization`` 0: the input QuantizeLinear and output DequantizeLinear run inside the
    HTP graph, not on the host): what Genie, which has no host-side quantizer, loads. Where QNN's default graph
    finalization fails to allocate (``FINALIZE_ERROR``), the graph is finalized again with ``FINALIZE_FALLBACK``;
    returns what was used then (for the manifest), else None. Any other refusal is raised."""
    opts = {"offload_graph_io_quantization": "0"}
    try:
        try:
            htp_session(Path(src), device, fp16=fp16, context_out=Path(ctx), provider_options=opts)
            return None
        except UnsupportedError as e:
            if FINALIZE_ERROR not in str(e):
                raise
        for f in Path(ctx).parent.glob(Path(ctx).stem + "*"):  # nothing of the failed attempt is kept
            f.unlink()
        htp_session(Path(src), device, fp16=fp16, context_out=Path(ctx), provider_options={**opts, **FINALIZE_FALLBACK})
    except RuntimeUnavailable as e:
        raise UnsupportedError(f"cannot compile a QNN context binary here: {e}") from None
    return (", ".join(f"{k} {v}" for k, v in FINALIZE_FALLBACK.items()) +
            f" (the default finalization failed: {FINALIZE_ERROR})")


def io_encodings(qdq: Path) -> dict:
    """Each float graph input's and output's encoding in the QDQ graph ``qdq``: the first QuantizeLinear an input
    reaches (through ``MOVES`` and the ``Where`` that zeroes unwritten slots, which run float), the DequantizeLinear
    writing an output: ``{name: {"scale", "zero_point", "type", "range"}}``."""
    import onnx
    from onnx import numpy_helper

    g = onnx.load(str(qdq), load_external_data=False).graph
    consts = {t.name: t for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    ends = {i.name: q for i in g.input if (q := _first_quantize(g, i.name)) is not None}
    for o in g.output:
        if o.name in producer and producer[o.name].op_type == "DequantizeLinear":
            ends[o.name] = producer[o.name]
    found = {}
    for name, n in sorted(ends.items()):
        if n.input[1] not in consts or n.input[2] not in consts:
            continue
        scale, zp = numpy_helper.to_array(consts[n.input[1]]), numpy_helper.to_array(consts[n.input[2]])
        if scale.size != 1:
            continue
        lo, hi = np.iinfo(zp.dtype).min, np.iinfo(zp.dtype).max
        found[name] = {"scale": float(scale), "zero_point": int(zp), "type": str(zp.dtype),
                       "range": [float(scale) * (int(lo) - int(zp)), float(scale) * (int(hi) - int(zp))]}
    return found


def cleanup(work: Path, graphs) -> None:
    for g in graphs:
        for f in work.glob(f"{g.name}.qdq.onnx*"):
            f.unlink()
        shutil.rmtree(work / f".qdq-{g.name}", ignore_errors=True)
