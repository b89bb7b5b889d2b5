"""Target ``adreno_gpu``: the ONNX graphs the QNN GPU backend (Adreno) consumes, fp32 or fp16 (weights and compute in
fp16, graph inputs and outputs kept fp32 so the host loop is unchanged).

The QNN GPU backend cannot initialize on these machines (``QNN_BACKEND_ERROR_CANNOT_INITIALIZE``; docs/targets.md),
so parity is measured by executing the same files on ONNX Runtime CPU (which runs the fp16 graph too). Those figures
are recorded in the manifest, but the verdict is ``unverified`` on target until a run on an Adreno GPU (AI Hub)
verifies it; a file that already fails locally is blocked.
"""
from __future__ import annotations

from pathlib import Path

from ..artifacts.onnx_external import beside_the_model
from ..errors import MissingDependency
from ..lowering.onnx_export import OPSET, export_onnx, onnx_files
from ..runtimes.ort import ort_cpu
from .base import Built, Execution, ExportRequest, Target

NOT_ON_TARGET = ("the QNN GPU backend cannot initialize on this machine; parity was measured by executing the same "
                 "file on ONNX Runtime CPU")


def to_fp16(src: Path, dst: Path) -> None:
    """fp32 ONNX -> fp16 weights and compute with fp32 graph inputs/outputs (ORT's float16 converter)."""
    try:
        import onnx
        from onnxruntime.transformers.float16 import convert_float_to_float16
    except ImportError:
        raise MissingDependency("onnx and onnxruntime are needed for the fp16 GPU graph") from None
    model = convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)
    with beside_the_model():
        onnx.save(model, str(dst), save_as_external_data=True, location=dst.name + ".data")


class AdrenoGpu(Target):
    name, format = "adreno_gpu", "onnx-qnn-gpu"
    schemes = ("fp32", "fp16")

    def export(self, req: ExportRequest, out: Path) -> Built:
        files, own = {}, []
        fp16 = req.scheme.half
        for g in req.component.each_graph():
            # a component's own form for this target (e.g. fp16-safe forms of its blocks), else the graph as it is
            module = req.component.export_module(self.name, g, req.scheme)
            if module is not g.module:
                own.append(g.name)
            if fp16:
                work = out / f".fp32-{g.name}"
                work.mkdir()
                to_fp16(export_onnx(module, g, work / f"{g.name}.onnx"), out / f"{g.name}.onnx")
                for f in work.iterdir():
                    f.unlink()
                work.rmdir()
            else:
                export_onnx(module, g, out / f"{g.name}.onnx")
            files.update(onnx_files(out / f"{g.name}.onnx", g.name))
        info = {"opset": OPSET, "precision": req.scheme.name, "io_dtype": "float32",
                "backend": "QNN GPU (libQnnGpu.so), Adreno", "component_forms": own or None}
        if fp16:
            info["fp16_conversion"] = "onnxruntime.transformers.float16.convert_float_to_float16(keep_io_types=True)"
        return Built(self.name, req.scheme.name, out, files, info)

    def execution(self, built, component, device) -> Execution:
        runners = {g.name: ort_cpu(built.path(g.name), [s.name for s in g.outputs]) for g in component.graphs()}
        return Execution("onnxruntime-cpu (local stand-in for the QNN GPU backend)", component.chain(runners),
                         verified_on_target=False, note=NOT_ON_TARGET)


TARGET = AdrenoGpu()
