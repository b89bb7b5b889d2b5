"""Target ``executorch_coreml``: the ``executorch`` target's ``.pte`` programs lowered to the CoreML delegate (fp16)
instead of XNNPACK, with the same export, KV layout and execution.

The CoreML delegate lowers on Linux, but no CoreML backend exists in the Linux runtime: those programs are
``unverified`` here; on macOS an ExecuTorch runtime built with the CoreML backend executes them with the same code.
"""
from __future__ import annotations

from .executorch import KV_LAYOUT, ExecuTorchXnnpack


class ExecuTorchCoreML(ExecuTorchXnnpack):
    name, format = "executorch_coreml", "executorch-pte"
    schemes = ("fp16",)
    backend = "CoreMLBackend"
    deployment_target = "iOS17"

    def partitioner(self, scheme):
        import coremltools as ct
        from executorch.backends.apple.coreml.compiler import CoreMLBackend
        from executorch.backends.apple.coreml.partition import CoreMLPartitioner
        specs = CoreMLBackend.generate_compile_specs(compute_precision=ct.precision.FLOAT16,
                                                     minimum_deployment_target=getattr(ct.target, self.deployment_target))
        return CoreMLPartitioner(compile_specs=specs)

    def info(self, scheme) -> dict:
        return {"backend": "coreml", "compute_precision": "fp16", "minimum_deployment_target": self.deployment_target,
                "kv_cache": KV_LAYOUT, "method": "forward"}


TARGET = ExecuTorchCoreML()
