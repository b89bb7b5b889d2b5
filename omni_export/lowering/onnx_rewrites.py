"""Rewrites of an exported ONNX graph, streamed initializer by initializer (one weight in memory at a time).

``matmul_as_conv`` is ``rewrites.LinearAsConv`` applied to the fp32 ONNX graph instead of the torch module: a QDQ
build then quantizes the graph the fp32 export already produced, instead of exporting the model a second time in
conv form (``benchmarks/qdq_part_memory.py`` times this rewrite for one part).
The graph it writes is the conv form's: same ops, same layout ([1, in, 1, rows], rows on the width), weights named
``<linear>.conv.weight`` as the conv-form export names them.
"""
from __future__ import annotations

import ast
import os
from pathlib import Path

import numpy as np
import torch

from ..errors import UnsupportedError

ALIGN = 4096  # external data offsets aligned like onnx's own writer, so the file can be memory-mapped per tensor


def _scope(node) -> str | None:
    """The torch module a node came from (``layers.0.self_attn.q_k_v_proj``), from the exporter's metadata."""
    for p in node.metadata_props:
        if p.key == "pkg.torch.onnx.name_scopes":
            try:
                scopes = ast.literal_eval(p.value)
            except (ValueError, SyntaxError):
                return None
            return scopes[-2] if len(scopes) >= 2 and scopes[-2] else None
    return None


class _DataWriter:
    """Writes initializers into one external data file, each at an aligned offset."""

    def __init__(self, path: Path):
        self.path, self.f = path, open(path, "wb")

    def put(self, tensor, arr: np.ndarray) -> None:
        from onnx import TensorProto
        off = self.f.tell()
        if off % ALIGN:
            self.f.write(b"\0" * (ALIGN - off % ALIGN))
            off = self.f.tell()
        arr = np.ascontiguousarray(arr)
        self.f.write(memoryview(arr).cast("B"))
        tensor.ClearField("raw_data")
        del tensor.external_data[:]
        tensor.data_location = TensorProto.EXTERNAL
        for k, v in (("location", self.path.name), ("offset", str(off)), ("length", str(arr.nbytes))):
            e = tensor.external_data.add()
            e.key, e.value = k, v

    def close(self):
        self.f.close()


def _external(tensor) -> dict | None:
    from onnx import TensorProto
    if tensor.data_location != TensorProto.EXTERNAL:
        return None
    return {e.key: e.value for e in tensor.external_data}


def read_initializer(tensor, base: Path) -> np.ndarray:
    """An initializer's values, mapped copy-on-write from its external file (never the whole file; writable
    without touching the file)."""
    from onnx import helper, numpy_helper
    ext = _external(tensor)
    if ext is None:
        return numpy_helper.to_array(tensor)
    dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
    off = int(ext.get("offset", 0))
    count = int(np.prod(tensor.dims, dtype=np.int64))
    return np.memmap(base / ext["location"], dtype=dtype, mode="c", offset=off, shape=(count,)).reshape(tuple(tensor.dims))


def matmul_as_conv(src: Path, dst: Path, dynamic_rows: bool = False) -> int:
    """Write ``dst``: ``src`` with every MatMul by a 2-D weight initializer ([in, out]) computed as a 1x1 Conv on
    [1, in, 1, rows] (a single row: [1, in, 1, 1], no transposes), a following Add of a [out] bias initializer folded
    into the conv. Same function in fp32. Inputs shared by several projections are laid out once. Returns the number
    of projections rewritten (projections that read one weight initializer share its conv weight); ``dst``'s
    weights go to ``dst.name + ".data"``, written before the graph. ``dynamic_rows``: a projection input whose
    leading dimensions hold one dynamic size (a GenAI graph's rows) is laid out with that size as -1. Not synced to
    disk: the result is a build's intermediate (the store commits finished steps)."""
    import onnx
    from onnx import helper, numpy_helper

    src, dst = Path(src), Path(dst)
    model = onnx.load(str(src), load_external_data=False)
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    shapes = {v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
              for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    shapes.update({v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
                   for v in list(g.input) + list(g.output)})
    consumers: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    graph_outputs = {o.name for o in g.output}

    def const(name, values):
        t = numpy_helper.from_array(np.asarray(values, dtype=np.int64), name)
        g.initializer.append(t)
        return name

    new_nodes, laid_out, convs, conv_of = [], {}, {}, {}
    drop_nodes, projections, made = set(), 0, set()
    for n in g.node:
        if id(n) in drop_nodes:
            continue
        w = inits.get(n.input[1]) if n.op_type == "MatMul" and len(n.input) == 2 else None
        if w is None or len(w.dims) != 2 or n.input[0] in inits:
            new_nodes.append(n)
            continue
        x, (cin, cout) = n.input[0], w.dims
        shape = shapes.get(x)
        dynamic = dynamic_rows and shape and shape[:-1].count(None) == 1
        if not shape or (any(d is None for d in shape) and not dynamic) or shape[-1] != cin:
            raise UnsupportedError(f"projection {n.name or n.output[0]}: input {x} has no static shape ending in {cin}")
        lead = [-1 if d is None else d for d in shape[:-1]]
        rows = -1 if dynamic else int(np.prod(lead, dtype=np.int64))
        scope = _scope(n) or n.output[0]
        projections += 1
        wname = conv_of.get(w.name)  # a weight several projections read (an unrolled loop) is laid out once
        if wname is None:
            wname = f"{scope}.conv.weight"
            while wname in inits or wname in convs:
                wname = f"{wname}_"
            convs[wname], conv_of[w.name] = w.name, wname  # filled in when the initializers are streamed: W^T
        # a following bias Add (MatMul + Add is how a biased linear exports at rank > 2) goes into the conv
        out_name, bias = n.output[0], None
        users = consumers.get(out_name, [])
        if out_name not in graph_outputs and len(users) == 1 and users[0].op_type == "Add":
            add = users[0]
            other = add.input[1] if add.input[0] == out_name else add.input[0]
            b = inits.get(other)
            if b is not None and list(b.dims) == [cout]:
                bias, out_name = other, add.output[0]
                drop_nodes.add(id(add))
        key = (x, rows)
        if key not in laid_out:  # the conv input, once per distinct projection input
            base = f"{x}_as_conv_in"
            if rows == 1:
                new_nodes.append(helper.make_node("Reshape", [x, const(f"{base}/shape", [1, cin, 1, 1])], [base]))
            else:
                new_nodes += [
                    helper.make_node("Reshape", [x, const(f"{base}/rows", [1, rows, cin])], [f"{base}_rows"]),
                    helper.make_node("Transpose", [f"{base}_rows"], [f"{base}_t"], perm=[0, 2, 1]),
                    helper.make_node("Unsqueeze", [f"{base}_t", const(f"{base}/axis", [2])], [base]),
                ]
            laid_out[key] = base
        tag = ""  # a module called several times (an unrolled loop): its conv and output named once a call
        while (y := f"{scope}.conv_out{tag}") in shapes or y in inits or y in made:
            tag += "_"
        made.add(y)
        new_nodes.append(helper.make_node("Conv", [laid_out[key], wname] + ([bias] if bias else []), [y],
                                          name=f"{scope}.conv{tag}", kernel_shape=[1, 1], strides=[1, 1],
                                          pads=[0, 0, 0, 0], dilations=[1, 1], group=1))
        if rows == 1:
            new_nodes.append(helper.make_node("Reshape", [y, const(f"{y}/shape", lead + [cout])], [out_name]))
        else:
            new_nodes += [
                helper.make_node("Reshape", [y, const(f"{y}/rows", [cout, rows])], [f"{y}_rows"]),
                helper.make_node("Transpose", [f"{y}_rows"], [f"{y}_t"], perm=[1, 0]),
                helper.make_node("Reshape", [f"{y}_t", const(f"{y}/shape", lead + [cout])], [out_name]),
            ]
    if dst.resolve() == src.resolve():
        raise UnsupportedError(f"{src.name}: the rewrite writes a new graph, not over its source")
    for n in new_nodes:  # every node named: a policy's float nodes are passed to the quantizer by name
        if not n.name:
            n.name = f"{n.output[0]}.{n.op_type}"
    del g.node[:]
    g.node.extend(new_nodes)

    used = {i for n in g.node for i in n.input}
    weights_of = {}
    for wname, old in convs.items():
        weights_of.setdefault(old, []).append(wname)
    kept = [t for t in g.initializer if t.name in used and t.name not in weights_of]
    originals = {old: inits[old] for old in weights_of}
    conv_protos = []
    for old, names in weights_of.items():
        for wname in names:
            t = onnx.TensorProto()
            t.name, t.data_type = wname, originals[old].data_type
            cin, cout = originals[old].dims
            t.dims.extend([cout, cin, 1, 1])
            conv_protos.append((t, old))
    data = dst.with_name(dst.name + ".data")
    tmp_data = data.with_name(data.name + ".partial")
    writer = _DataWriter(tmp_data)
    try:
        for t in kept:
            ext = _external(t)
            if ext is not None:
                writer.put(t, read_initializer(t, src.parent))
        for t, old in conv_protos:  # W^T, one weight in memory at a time
            w = torch.from_numpy(read_initializer(originals[old], src.parent))  # copy-on-write map: no copy
            writer.put(t, w.t().contiguous().numpy())  # torch's blocked, threaded transpose
    finally:
        writer.close()
    del g.initializer[:]
    g.initializer.extend(kept + [t for t, _ in conv_protos])
    for t in g.initializer:  # the location of every external tensor is the final data file's name
        for e in t.external_data:
            if e.key == "location":
                e.value = data.name
    os.replace(tmp_data, data)
    onnx.save(model, str(dst))
    return projections


RMS_CHAIN = ("ReduceMean", "Add", "Sqrt", "Reciprocal", "Mul", "Mul")


def _const_values(graph, base: Path) -> dict:
    """Scalar and small constants (initializers of at most 16 elements, ``Constant`` nodes) by name."""
    from onnx import numpy_helper
    vals = {t.name: np.array(read_initializer(t, base)) for t in graph.initializer if np.prod(t.dims) <= 16}
    vals.update({n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in graph.node
                 if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"})
    return vals


def fuse_rmsnorm(src: Path, dst: Path) -> int:
    """Write ``dst``: ``src`` with every RMSNorm the exporter decomposed (``F.rms_norm`` at opset 21:
    Pow(x, 2) -> ReduceMean(last axis) -> Add(eps) -> Sqrt -> Reciprocal -> Mul(x, .) -> Mul(., weight)) as ONE
    ``SimplifiedLayerNormalization`` node (ORT's fused RMSNorm, fp32 statistics; the QNN EP maps it to RmsNorm). The
    same function in fp32, but a quantized or fp16 build can no longer round x^2 (fp16: x^2 overflows on trained
    weights; a 16-bit range of x^2 spans the outlier's square: ``docs/parity.md``, "w8a16 on trained weights").
    Only the graph is rewritten (``dst`` may be ``src``): weights stay in ``src``'s data file. Returns the number of
    norms fused."""
    import onnx
    from onnx import helper

    src, dst = Path(src), Path(dst)
    model = onnx.load(str(src), load_external_data=False)
    g = model.graph
    consts = _const_values(g, src.parent)
    consumers: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    outputs = {o.name for o in g.output}
    rank = {v.name: len(v.type.tensor_type.shape.dim) for v in list(g.value_info) + list(g.input)
            if v.type.tensor_type.HasField("shape")}
    drop, fused = set(), {}
    for n in g.node:
        if n.op_type != "Pow" or n.input[1] not in consts or float(consts[n.input[1]]) != 2.0:
            continue
        x, chain, t = n.input[0], [], n.output[0]
        for op in RMS_CHAIN:
            users = consumers.get(t, [])
            if len(users) != 1 or users[0].op_type != op or t in outputs:
                break
            chain.append(users[0])
            t = users[0].output[0]
        if len(chain) != len(RMS_CHAIN):
            continue
        rm, add, _, _, mul_x, mul_w = chain
        axes = consts.get(rm.input[1]) if len(rm.input) > 1 else None
        keep = next((a.i for a in rm.attribute if a.name == "keepdims"), 1)
        eps = next((consts[i] for i in add.input if i in consts), None)
        weight = [i for i in mul_w.input if i != mul_x.output[0]]
        last = [-1] + ([rank[x] - 1] if x in rank else [])
        if (axes is None or np.size(axes) != 1 or int(np.ravel(axes)[0]) not in last or not keep or eps is None or np.size(eps) != 1
                or x not in mul_x.input or len(weight) != 1):
            continue
        fused[id(mul_w)] = helper.make_node("SimplifiedLayerNormalization", [x, weight[0]], [mul_w.output[0]],
                                            name=f"{mul_w.output[0]}.rmsnorm", axis=-1, epsilon=float(eps),
                                            stash_type=1)
        drop.update(id(k) for k in (n, *chain))
    nodes = [fused.get(id(n), n) for n in g.node if id(n) in fused or id(n) not in drop]
    used = {i for n in nodes for i in n.input} | outputs
    nodes = [n for n in nodes if n.op_type != "Constant" or n.output[0] in used]  # the dropped chain's constants
    produced = {o for n in nodes for o in n.output}
    del g.node[:]
    g.node.extend(nodes)
    for field, live in ((g.initializer, used), (g.value_info, produced)):
        kept = [t for t in field if t.name in live]
        del field[:]
        field.extend(kept)
    onnx.save(model, str(dst))
    return len(fused)
