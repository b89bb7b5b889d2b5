"""The min-max calibration graph: the source graph plus, per dtype, two outputs holding every calibrated tensor's
minimum and maximum (element i is tensor i's), so one ``session.run`` per sample returns every range.

Each tensor's reduction costs the runtime a kernel launch or two whatever its size, and a decoder step's activations
are small: a ReduceMin and a ReduceMax per tensor (3,796 extra nodes on the SmolLM2 decode step, 1,898 tensors) cost
as much as the graph itself. Tensors of one shape and dtype are therefore reduced together: concatenated (a copy of
small tensors) once the last of them is computed, then reduced row by row. Min and max are exact under any grouping,
so the ranges are the per-tensor ones (``tests/quantize/test_qdq_calibration.py`` checks them equal to
onnxruntime's calibrator). A group is closed once it holds ``GROUP_BYTES`` or when all open groups together hold
``OPEN_BYTES``, so large activations (a prefill's, an audio decoder's) are still reduced soon after they are made.
"""
from __future__ import annotations

import numpy as np

ALONE_BYTES = 16 << 10   # a tensor this large is reduced alone: copying it would cost more than a launch saves
GROUP_BYTES = 1 << 20    # a group's concatenated bytes: closed when it reaches this
OPEN_BYTES = 8 << 20     # all open groups together: the largest is closed beyond this
_ITEMSIZE = {1: 4, 10: 2}  # TensorProto.FLOAT, FLOAT16


def _static_shape(vi) -> tuple[int, ...] | None:
    dims = vi.type.tensor_type.shape.dim if vi.type.tensor_type.HasField("shape") else None
    if dims is None or not all(d.HasField("dim_value") and d.dim_value > 0 for d in dims) or not dims:
        return None
    return tuple(d.dim_value for d in dims)


class MinMaxGraph:
    """Adds the reductions to ``model`` (an ``onnx.ModelProto``, changed in place) for ``chosen`` tensors with their
    ``value_infos``; ``order[d]`` lists the tensors of dtype ``d`` in the order of the joined outputs
    ``output(op, d)``."""

    def __init__(self, model, chosen: set[str], value_infos: dict):
        from onnx import helper, numpy_helper

        self.helper, g = helper, model.graph
        opset = max([o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] or [13])
        self.axes_input = opset >= 18  # ReduceMin/Max take their axes as an input from opset 18
        self.g, self.numpy_helper, self.row_shapes = g, numpy_helper, set()
        g.initializer.append(numpy_helper.from_array(np.array([1], dtype=np.int64), "omni_calib_axis1"))
        self.vi = value_infos
        self.open: dict[tuple, list[str]] = {}   # (dtype, shape) -> tensors waiting
        self.open_bytes: dict[tuple, int] = {}
        self.parts: dict[int, list[tuple[str, list[str]]]] = {}  # dtype -> (group name, its tensors), in order
        self.nodes: list = []
        inputs = {i.name for i in g.input}
        for t in sorted(chosen & inputs):
            self._add(t)
        for n in list(g.node):  # each group reduced right after its last tensor's producer
            self.nodes.append(n)
            for t in n.output:
                if t in chosen:
                    self._add(t)
        for key in list(self.open):
            self._close(key)
        self.order = {d: [t for _, ts in parts for t in ts] for d, parts in sorted(self.parts.items())}
        for d, parts in sorted(self.parts.items()):
            for op in ("ReduceMin", "ReduceMax"):
                out = self.output(op, d)
                self.nodes.append(helper.make_node("Concat", [f"{name}_{op}" for name, _ in parts], [out], axis=0,
                                                   name=out))
                g.output.append(helper.make_tensor_value_info(out, d, [len(self.order[d])]))
        del g.node[:]
        g.node.extend(self.nodes)

    @staticmethod
    def output(op: str, dtype: int) -> str:
        return f"omni_calib_{op}_{dtype}"

    def _add(self, t: str) -> None:
        tt = self.vi[t].type.tensor_type
        shape = _static_shape(self.vi[t])
        size = None if shape is None else int(np.prod(shape)) * _ITEMSIZE.get(tt.elem_type, 4)
        if size is None or size >= ALONE_BYTES:  # unknown or scalar shape, or large: reduced alone, at once
            self._reduce(tt.elem_type, [t])
            return
        key = (tt.elem_type, shape)
        self.open.setdefault(key, []).append(t)
        self.open_bytes[key] = self.open_bytes.get(key, 0) + size
        if self.open_bytes[key] >= GROUP_BYTES:
            self._close(key)
        while sum(self.open_bytes.values()) > OPEN_BYTES:
            self._close(max(self.open_bytes, key=self.open_bytes.get))

    def _close(self, key) -> None:
        self.open_bytes.pop(key)
        self._reduce(key[0], self.open.pop(key))

    def _reduce(self, dtype: int, ts: list[str]) -> None:
        """``[len(ts)]`` minima and maxima of ``ts`` (same shape): concatenated, viewed as one row per tensor."""
        h = self.helper
        name = f"omni_calib_g{sum(len(p) for p in self.parts.values())}_{ts[0]}"
        joined = ts[0]
        if len(ts) > 1:
            joined = name + "_cat"
            self.nodes.append(h.make_node("Concat", ts, [joined], axis=0, name=joined))
        rows, shape = name + "_rows", f"omni_calib_rows_{len(ts)}"
        if shape not in self.row_shapes:
            self.row_shapes.add(shape)
            self.g.initializer.append(self.numpy_helper.from_array(np.array([len(ts), -1], dtype=np.int64), shape))
        self.nodes.append(h.make_node("Reshape", [joined, shape], [rows], name=rows))
        for op in ("ReduceMin", "ReduceMax"):
            out = f"{name}_{op}"
            if self.axes_input:
                self.nodes.append(h.make_node(op, [rows, "omni_calib_axis1"], [out], keepdims=0, name=out))
            else:
                self.nodes.append(h.make_node(op, [rows], [out], axes=[1], keepdims=0, name=out))
        self.parts.setdefault(dtype, []).append((name, ts))
