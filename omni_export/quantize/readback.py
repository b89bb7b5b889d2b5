"""What a written QDQ graph really gives a tensor, read back from the file (scale and zero-point initializers only;
the weights stay on disk): the manifest records the plan and, beside it, where the file differs from the plan."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def written_encodings(path: Path, tensors) -> dict[str, dict | None]:
    """``tensor -> {"type", "scale", "zero_point"}`` as the graph at ``path`` quantizes it (the QuantizeLinear
    onnxruntime's quantizer names ``<tensor>_QuantizeLinear``, or the DequantizeLinear that writes a graph output
    ``<tensor>``); ``None``: not quantized there."""
    import onnx
    from onnx import numpy_helper

    g = onnx.load(str(path), load_external_data=False).graph
    consts = {i.name: i for i in g.initializer if i.data_location != onnx.TensorProto.EXTERNAL}
    by_name = {n.name: n for n in g.node if n.op_type == "QuantizeLinear"}
    dq_of = {n.output[0]: n for n in g.node if n.op_type == "DequantizeLinear"}
    out = {}
    for t in tensors:
        node = by_name.get(f"{t}_QuantizeLinear") or dq_of.get(t)
        if node is None or len(node.input) < 3 or not {node.input[1], node.input[2]} <= set(consts):
            out[t] = None
            continue
        scale, zp = (numpy_helper.to_array(consts[i]) for i in node.input[1:3])
        out[t] = {"type": np.dtype(zp.dtype).name, "scale": float(scale), "zero_point": int(zp)}
    return out


def off_plan_int16(path: Path, groups) -> dict[str, str]:
    """The tensors of ``groups`` (planned int16 symmetric) that the graph at ``path`` quantizes otherwise, each with
    what it has instead; the tensors a graph does not hold are skipped."""
    names = {t for g in groups for t in g}
    off = {}
    for t, enc in written_encodings(path, names).items():
        if enc is None:
            continue
        if enc["type"] != "int16" or enc["zero_point"] != 0:
            off[t] = f"{enc['type']} scale {enc['scale']:.4g} zero point {enc['zero_point']}"
    return dict(sorted(off.items()))
