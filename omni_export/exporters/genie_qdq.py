"""The ``genie`` target's quantized bundles: the Genie-form graphs (``components.decoder_genie``) quantized as the
``qdq_onnx`` target quantizes the decode step, under the decode step's own QDQ policy (``Component.qdq_policy``:
for ``w8a16`` int16 down/v/head weights, searched int8 scales, widened ranges), calibrated on the decode step's own
calibration set re-keyed to Genie's inputs (the same sink-free positions, fed as Genie feeds them), then compiled to
QNN HTP context binaries whose IO stays float32 (the graph quantizes inside).

IO: float32 in and out, so Genie's own values are what the graph reads: its 0 / -1000 mask, its cos/sin and the K/V
bytes it copies from ``past_*_out`` to ``past_*_in``. Inside, each input is quantized by the graph's first
QuantizeLinear; a layer's ``past_*_in`` and ``past_*_out`` share one encoding, so a row Genie copies back re-quantizes
to the same code it was written with. The encodings are read back from the built graph into the manifest
(``io_encodings``)."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from ..errors import CalibrationError, UnsupportedError
from ..runtimes import RuntimeUnavailable
from ..runtimes.ort import htp_session
from .onnx_export import export_onnx
from .onnx_rewrites import matmul_as_conv
from .parallel import PartPool
from .qdq_onnx import _Part
from .qdq_policy import load_ranges, merge_groups, shared_encodings, static_plan

GENIE_KV = re.compile(r"^past_(key|value)_(\d+)_(in|out)$")
IO_NOTE = ("float32 IO (mask, cos/sin, K/V, logits; input_ids int32): Genie writes and reads plain float32 values, "
           "the graph quantizes them inside with the encodings below; a layer's past_*_in and past_*_out share one "
           "encoding, so a K/V row Genie copies back re-quantizes to the code it was written with")


def io_groups(graphs) -> list[list[str]]:
    """Tensors that carry one encoding: each layer's ``past_{kv}_{i}_in`` and ``_out`` (Genie copies the one into the
    other), and a tensor one part outputs and the next reads (``hidden_*``)."""
    ins = {s.name for g in graphs for s in g.inputs}
    outs = {s.name for g in graphs for s in g.outputs}
    pairs: dict[tuple, list[str]] = {}
    for t in sorted(ins | outs):
        m = GENIE_KV.match(t)
        if m:
            pairs.setdefault(m.groups()[:2], []).append(t)
    return [sorted(v) for v in pairs.values() if len(v) > 1] + [[t] for t in sorted(ins & outs)]


def quantize_graphs(form, graphs, scheme, calibration, work: Path) -> tuple[dict[str, Path], dict]:
    """Each Genie-form graph of ``graphs`` quantized to ``work/<name>.qdq.onnx``; returns (paths, record)."""
    if scheme.calibrated and calibration is None:
        raise CalibrationError(f"scheme {scheme.name} is calibrated but no calibration set was given")
    if not scheme.calibrated:
        raise UnsupportedError(f"target genie: scheme {scheme.name} is uncalibrated: a Genie-form graph has no random "
                               "stand-in inputs (its mask, token ids and caches follow Genie's contract)")
    parts = []
    for g in graphs:
        d = work / f".qdq-{g.name}"
        d.mkdir()
        fp32 = export_onnx(g.module, g, d / "fp32.onnx", fuse_norms=scheme.fused_norm)
        form.release()
        src = d / "rewritten.onnx"
        matmul_as_conv(fp32, src)
        policy = form.qdq_policy(g.name, g.module, scheme) or {}
        part = _Part(g, src, work / f"{g.name}.qdq.onnx", policy, static_plan(src, policy, scheme.activations))
        part.calibrate(form.calibration_feeds(calibration, graphs, g.name), scheme)
        parts.append(part)
    rhs = [grp for p in parts for grp in p.rhs_io()]
    groups = merge_groups(io_groups(graphs) + rhs)
    shared, record = shared_encodings([load_ranges(p.cache) for p in parts], groups, scheme.activations,
                                      {t for grp in rhs for t in grp})
    with PartPool(len(parts), None) as pool:
        for p in parts:
            p.submit(pool, (), scheme, shared)
    info = {"component_policy": {p.graph.name: p.record() for p in parts if p.policy},
            "shared_encodings": record,
            "float_nodes": {p.graph.name: len(p.plan["float_nodes"]) for p in parts if p.plan["float_nodes"]},
            "activation_ranges": f"calibration set {calibration.hash[:12]} (the decode step's), fed as Genie feeds it"}
    return {p.graph.name: p.dst for p in parts}, info


def compile_float_io(src: Path, device, fp16: bool, ctx: Path) -> None:
    """``src`` (a QDQ graph with float32 IO) compiled to a context binary ``ctx`` whose QNN graph keeps that float32
    IO (``offload_graph_io_quantization`` 0: the input QuantizeLinear and output DequantizeLinear run inside the
    HTP graph, not on the host): what Genie, which has no host-side quantizer, loads."""
    try:
        htp_session(Path(src), device, fp16=fp16, context_out=Path(ctx),
                    provider_options={"offload_graph_io_quantization": "0"})
    except RuntimeUnavailable as e:
        raise UnsupportedError(f"cannot compile a QNN context binary here: {e}") from None


def io_encodings(qdq: Path) -> dict:
    """Each graph input's and output's encoding in the QDQ graph ``qdq`` (the QuantizeLinear reading an input, the
    DequantizeLinear writing an output): ``{name: {"scale", "zero_point", "type"}}``."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(qdq), load_external_data=False)
    g = m.graph
    consts = {t.name: t for t in g.initializer}
    ins, outs = {i.name for i in g.input}, {o.name for o in g.output}
    found = {}
    for n in g.node:
        name = (n.input[0] if n.op_type == "QuantizeLinear" and n.input[0] in ins else
                n.output[0] if n.op_type == "DequantizeLinear" and n.output[0] in outs else None)
        if name is None or name in found or n.input[1] not in consts or n.input[2] not in consts:
            continue
        scale, zp = numpy_helper.to_array(consts[n.input[1]]), numpy_helper.to_array(consts[n.input[2]])
        if scale.size != 1:
            continue
        found[name] = {"scale": float(scale), "zero_point": int(zp), "type": str(zp.dtype),
                       "range": [float(scale) * (float(_qmin(zp)) - int(zp)), float(scale) * (float(_qmax(zp)) - int(zp))]}
    return dict(sorted(found.items()))


def _qmin(zp):
    import numpy as np
    return np.iinfo(zp.dtype).min


def _qmax(zp):
    import numpy as np
    return np.iinfo(zp.dtype).max


def cleanup(work: Path, graphs) -> None:
    for g in graphs:
        for f in work.glob(f"{g.name}.qdq.onnx*"):
            f.unlink()
        shutil.rmtree(work / f".qdq-{g.name}", ignore_errors=True)
