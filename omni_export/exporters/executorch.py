"""Target ``executorch`` (XNNPACK): ``.pte`` programs from ``torch.export``, one per component graph, with the KV
caches as explicit inputs and the new K/V rows as outputs (the same host loop as the ONNX artifacts).

Schemes: ``fp32``; ``w8a8_dynamic`` (the XNNPACK quantizer through pt2e: per-channel int8 weights, int8
activations quantized per call); ``w4a8_dynamic`` (ExecuTorch's 8da4w: int4 weights in groups of 32, dynamic int8
activations); ``int8_weight_only_torchao`` (torchao ``Int8WeightOnlyConfig``, lowered to XNNPACK:
it exports but computes wrong numbers, so the gate must block it). Every XNNPACK ``.pte`` is executed by the
ExecuTorch runtime and gated like the ONNX artifacts. The CoreML delegate's programs are ``executorch_coreml``.
"""
from __future__ import annotations

import copy
from pathlib import Path

import torch

from ..errors import MissingDependency, UnsupportedError
from ..lowering.torch_export import first_line, gelu_tanh_as_ops, provenance_by_reference, quiet_lowering
from ..runtimes import RuntimeUnavailable
from ..runtimes.executorch_rt import executorch_runner
from .base import Built, Execution, ExportRequest, Target

INT4_GROUP = 32  # int4 weight group size of w4a8_dynamic (ExecuTorch's 8da4w default for small models)
KV_LAYOUT = "explicit cache inputs, new K/V rows as outputs (host writes them)"


def quantized_program(module: torch.nn.Module, example: tuple, scheme) -> torch.export.ExportedProgram:
    """``torch.export`` of ``module`` with the scheme's quantization applied (the module is not mutated)."""
    module = module.eval()
    with torch.no_grad():
        if scheme.dynamic_activations and scheme.weights == "int8":  # w8a8_dynamic
            from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (XNNPACKQuantizer,
                                                                                 get_symmetric_quantization_config)
            from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
            q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True))
            gm = prepare_pt2e(torch.export.export(module, example).module(), q)
            gm(*example)  # dynamic activations: no ranges are observed, this only traces the observers once
            module = convert_pt2e(gm)
        elif scheme.dynamic_activations and scheme.weights == "int4":  # w4a8_dynamic (8da4w)
            from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
            from torchao.quantization.granularity import PerGroup
            module = copy.deepcopy(module)  # quantize_ swaps weights in place
            quantize_(module, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4,
                                                                    weight_granularity=PerGroup(INT4_GROUP)))
        elif scheme.weight_only and scheme.weights == "int8" and scheme.activations == "fp32":  # torchao int8 WO
            from torchao.quantization import Int8WeightOnlyConfig, quantize_
            module = copy.deepcopy(module)  # quantize_ swaps weights in place
            quantize_(module, Int8WeightOnlyConfig())
        elif scheme.quantized:
            raise UnsupportedError(f"scheme {scheme.name} has no ExecuTorch lowering")
        return torch.export.export(module, example)


def lower(program, partitioner, path: Path) -> int:
    """Edge-lower ``program`` with ``partitioner`` and write the ``.pte`` to ``path`` (streamed to the file, not held
    as one more in-memory copy of the weights); return the number of delegated subgraphs."""
    from executorch.exir import to_edge_transform_and_lower
    edge = to_edge_transform_and_lower(gelu_tanh_as_ops(program), partitioner=[partitioner])
    del program
    n = sum(1 for n in edge.exported_program().graph.nodes
            if n.op == "call_function" and "executorch_call_delegate" in str(n.target))
    et = edge.to_executorch()
    del edge
    with open(path, "wb") as f:
        et.write_to_file(f)
    return n


class ExecuTorchXnnpack(Target):
    name, format = "executorch", "executorch-pte"
    schemes = ("fp32", "w8a8_dynamic", "w4a8_dynamic", "int8_weight_only_torchao")
    backend = "XnnpackBackend"

    def partitioner(self, scheme):
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        return XnnpackPartitioner()

    def prepare(self, component, graph, scheme) -> torch.nn.Module:
        """The graph form this backend delegates whole: the component's own form for this target (``graph_for``, a
        copy; the component's module is not mutated), else the graph as it is."""
        return component.export_module(self.name, graph, scheme)

    def export(self, req: ExportRequest, out: Path) -> Built:
        files, delegated = {}, {}
        for g in req.component.each_graph():
            try:
                with quiet_lowering(), provenance_by_reference():
                    program = quantized_program(self.prepare(req.component, g, req.scheme), g.example_inputs(), req.scheme)
                    delegated[g.name] = lower(program, self.partitioner(req.scheme), out / f"{g.name}.pte")
            except ImportError as e:
                raise MissingDependency(f"ExecuTorch export needs {e.name}: {first_line(e)}") from None
            except UnsupportedError:
                raise
            except Exception as e:
                raise UnsupportedError(f"ExecuTorch lowering of graph {g.name} ({req.scheme.name}) failed: "
                                       f"{first_line(e)}") from None
            files[g.name] = f"{g.name}.pte"
        return Built(self.name, req.scheme.name, out, files, self.info(req.scheme) | {"delegated_subgraphs": delegated})

    def info(self, scheme) -> dict:
        quant = {"w8a8_dynamic": "XNNPACKQuantizer (pt2e), symmetric per-channel int8 weights, dynamic int8 activations",
                 "w4a8_dynamic": f"torchao quantize_(Int8DynamicActivationIntxWeightConfig(int4, PerGroup({INT4_GROUP})))",
                 "int8_weight_only_torchao": "torchao quantize_(Int8WeightOnlyConfig())"}.get(scheme.name)
        return {"backend": "xnnpack", "quantizer": quant, "kv_cache": KV_LAYOUT, "method": "forward"}

    def execution(self, built, component, device) -> Execution:
        try:
            runners = {g.name: executorch_runner(built.path(g.name), [s.name for s in g.inputs], (self.backend,))
                       for g in component.graphs()}
        except RuntimeUnavailable as e:
            return Execution(None, unavailable=str(e))
        return Execution(f"executorch-runtime ({self.backend})", component.chain(runners))


TARGET = ExecuTorchXnnpack()
