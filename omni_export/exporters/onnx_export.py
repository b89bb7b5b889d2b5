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
            torch.onnx.export(module, graph.example_inputs(), str(path), input_names=names_in,
                              output_names=names_out, opset_version=OPSET, dynamo=True, external_data=True,
                              verbose=False, optimize=True)
    except Exception as e:
        raise UnsupportedError(f"ONNX export of graph {graph.name} failed: {str(e).splitlines()[0][:300]}") from None
    return path


def onnx_files(path: Path, graph_name: str = "model") -> dict[str, str]:
    """Logical names of one graph's files: ``<graph>`` for the model, ``<graph>.weights`` for its external data."""
    files = {graph_name: path.name}
    data = path.with_name(path.name + ".data")
    if data.exists():
        files[f"{graph_name}.weights"] = data.name
    return files
