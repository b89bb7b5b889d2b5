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


def export_onnx(module: torch.nn.Module, component, path: Path) -> Path:
    """Export ``module`` (the component's graph or a rewritten copy) with the component's IO names."""
    module = module.eval()
    for p in module.parameters():
        p.requires_grad_(False)
    names_in = [s.name for s in component.input_specs()]
    names_out = [s.name for s in component.output_specs()]
    buf = io.StringIO()
    try:
        with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(buf):
            warnings.simplefilter("ignore")
            logging.getLogger("torch.onnx").setLevel(logging.ERROR)
            torch.onnx.export(module, component.example_inputs(), str(path), input_names=names_in,
                              output_names=names_out, opset_version=OPSET, dynamo=True, external_data=True,
                              verbose=False, optimize=True)
    except Exception as e:
        raise UnsupportedError(f"ONNX export of {component.name} failed: {str(e).splitlines()[0][:300]}") from None
    return path


def onnx_files(path: Path) -> dict[str, str]:
    files = {"model": path.name}
    data = path.with_name(path.name + ".data")
    if data.exists():
        files["weights"] = data.name
    return files
