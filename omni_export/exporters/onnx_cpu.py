"""Target ``onnx``: the fp32 ONNX graph (external data), executed by ONNX Runtime on the CPU.

It is the CPU artifact and the source the HTP fp16 context binary is compiled from."""
from __future__ import annotations

from pathlib import Path

from ..runtimes.ort import ort_cpu
from . import Built, Execution, ExportRequest, Target
from .onnx_export import export_onnx, onnx_files


class OnnxCpu(Target):
    name, format, schemes, version = "onnx", "onnx", ("fp32",), "1"

    def export(self, req: ExportRequest, out: Path) -> Built:
        path = export_onnx(req.component.module, req.component, out / "model.onnx")
        return Built(self.name, req.scheme.name, out, onnx_files(path), {"opset": 21, "precision": "fp32"})

    def execution(self, built, component, device) -> Execution:
        names = [s.name for s in component.output_specs()]
        return Execution("onnxruntime-cpu", ort_cpu(built.path(), names))


TARGET = OnnxCpu()
