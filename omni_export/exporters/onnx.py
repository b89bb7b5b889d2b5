"""Target ``onnx``: the fp32 ONNX graph (external data), executed by ONNX Runtime on the CPU.

It is the CPU artifact and the source the HTP fp16 context binary is compiled from."""
from __future__ import annotations

import functools
from pathlib import Path

from ..lowering.onnx_export import export_onnx, onnx_files
from ..runtimes.ort import ort_cpu
from .base import Built, Execution, ExportRequest, Target, lazy_chain


class OnnxCpu(Target):
    name, format, schemes = "onnx", "onnx", ("fp32",)

    def export(self, req: ExportRequest, out: Path) -> Built:
        files = {}
        for g in req.component.each_graph():
            files.update(onnx_files(export_onnx(g.module, g, out / f"{g.name}.onnx"), g.name))
        return Built(self.name, req.scheme.name, out, files, {"opset": 21, "precision": "fp32"})

    def execution(self, built, component, device) -> Execution:
        """A chain of parts runs one part's session at a time where the component's trace allows it (the fp32
        weights of a full-size decode step's four parts are ~8 GB together)."""
        parts = {g.name: functools.partial(ort_cpu, built.path(g.name), [s.name for s in g.outputs])
                 for g in component.graphs()}
        run, parts = lazy_chain(component, parts)
        return Execution("onnxruntime-cpu", run, parts=parts)


TARGET = OnnxCpu()
