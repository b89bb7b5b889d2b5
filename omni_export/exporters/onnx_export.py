"""torch -> ONNX (opset 21, dynamo exporter, weights as external data). Shared by the ONNX-based targets."""
from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path

import torch

from ..errors import UnsupportedError

OPSET = 21  # from opset 18 the ORT quantizer deep-copies the model to upgrade it (2x memory); 21 avoids that


def export_onnx(module: torch.nn.Module, graph, path: Path) -> Path:
    """Export ``module`` (a component graph's module or a rewritten copy) with the graph's IO names."""
    module = module.eval()
    for p in module.parameters():
        p.requires_grad_(False)
    names_in = [s.name for s in graph.inputs]
    names_out = [s.name for s in graph.outputs]
    buf = io.StringIO()
    try:
        with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(buf):
            warnings.simplefilter("ignore")
            logging.getLogger("torch.onnx").setLevel(logging.ERROR)
            prog = torch.onnx.export(module, graph.example_inputs(), None, input_names=names_in,
                                     output_names=names_out, opset_version=OPSET, dynamo=True, verbose=False,
                                     optimize=True)
            _contiguous_on_write(prog.model)
            prog.save(str(path), include_initializers=True, keep_initializers_as_inputs=False, external_data=True)
    except Exception as e:
        raise UnsupportedError(f"ONNX export of graph {graph.name} failed: {str(e).splitlines()[0][:300]}") from None
    return path


def _contiguous_on_write(model) -> None:
    """The exporter's constant folding leaves each folded weight transpose (MatMul's [in, out] weight) as a strided
    numpy view, and numpy writes a strided array element by element: at full size that walk was most of a part's
    save. Each such tensor is made contiguous (torch's blocked transpose) when it is written, one at a time, so no
    second copy of the weights is held. Same bytes in the file (the fp32 export step, full size: 130.6 -> 63.8 s for
    the decode step's 4 parts with this and nothing else changed in it, ``benchmarks/recipe_resources.py``)."""
    import numpy as np
    import onnx_ir as ir

    for v in model.graph.initializers.values():
        t = v.const_value
        raw = getattr(t, "raw", None)
        if type(t) is ir.Tensor and isinstance(raw, np.ndarray) and not raw.flags["C_CONTIGUOUS"]:
            def dense(a=raw, name=t.name):
                try:
                    c = torch.from_numpy(a).contiguous().numpy()
                except (TypeError, ValueError):  # a dtype torch has no type for
                    c = np.ascontiguousarray(a)
                return ir.Tensor(c, name=name)
            v.const_value = ir.LazyTensor(dense, dtype=t.dtype, shape=t.shape, name=t.name, cache=False)


def onnx_files(path: Path, graph_name: str = "model") -> dict[str, str]:
    """Logical names of one graph's files: ``<graph>`` for the model, ``<graph>.weights`` for its external data."""
    files = {graph_name: path.name}
    data = path.with_name(path.name + ".data")
    if data.exists():
        files[f"{graph_name}.weights"] = data.name
    return files
