"""Targets ``executorch`` (XNNPACK) and ``executorch_coreml`` (the CoreML delegate): ``.pte`` programs from
``torch.export``, one per component graph, with the KV caches as explicit inputs and the new K/V rows as outputs
(the same host loop as the ONNX artifacts).

XNNPACK schemes: ``fp32``; ``w8a8_dynamic`` (the XNNPACK quantizer through pt2e: per-channel int8 weights, int8
activations quantized per call); ``w4a8_dynamic`` (ExecuTorch's 8da4w: int4 weights in groups of 32, dynamic int8
activations); ``int8_weight_only_torchao`` (torchao ``Int8WeightOnlyConfig``, lowered to XNNPACK:
it exports but computes wrong numbers, so the gate must block it). Every XNNPACK ``.pte`` is executed by the
ExecuTorch runtime and gated like the ONNX artifacts.

The CoreML delegate (fp16) lowers on Linux, but no CoreML backend exists in the Linux runtime: those programs are
``unverified`` here; on macOS an ExecuTorch runtime built with the CoreML backend executes them with the same code.
"""
from __future__ import annotations

import contextlib
import copy
import io
import logging
import warnings
from pathlib import Path

import torch

from ..errors import MissingDependency, UnsupportedError
from ..runtimes import RuntimeUnavailable
from ..runtimes.executorch_rt import executorch_runner
from .base import Built, Execution, ExportRequest, Target

INT4_GROUP = 32  # int4 weight group size of w4a8_dynamic (ExecuTorch's 8da4w default for small models)
KV_LAYOUT = "explicit cache inputs, new K/V rows as outputs (host writes them)"


@contextlib.contextmanager
def _quiet():
    """Silence Python-level warnings, logging and progress bars of the lowering passes."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        level = logging.root.level
        logging.root.setLevel(logging.ERROR)
        try:
            yield
        finally:
            logging.root.setLevel(level)


@contextlib.contextmanager
def _provenance_by_reference():
    """torch.fx records where every node came from (``node.meta["from_node"]``, a chain of ``NodeSource``) and each
    new record deep-copies its source's whole chain, which grows by one link per pass: copying it was an eighth of
    lowering the SmolLM2 decode step to XNNPACK. The records are never changed once made, so while exporting here a
    new record refers to its source's links instead of copying them (its own list, the same links); the ``.pte``
    is byte-identical (``tests/exporters/test_executorch.py``)."""
    from torch.fx import traceback as fx_traceback

    cls = fx_traceback.NodeSource
    original = cls.__init__

    def init(self, node, pass_name="", action=None):
        original(self, None, pass_name, action)
        if node:
            self.node_info = cls.NodeInfo(name=node.name, target=str(node.target), graph_id=id(node.graph))
            self.from_node = list(node.meta.get("from_node", ()))

    cls.__init__ = init
    try:
        yield
    finally:
        cls.__init__ = original


def _first_line(e: Exception) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:300]


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
    edge = to_edge_transform_and_lower(program, partitioner=[partitioner])
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
                with _quiet(), _provenance_by_reference():
                    program = quantized_program(self.prepare(req.component, g, req.scheme), g.example_inputs(), req.scheme)
                    delegated[g.name] = lower(program, self.partitioner(req.scheme), out / f"{g.name}.pte")
            except ImportError as e:
                raise MissingDependency(f"ExecuTorch export needs {e.name}: {_first_line(e)}") from None
            except UnsupportedError:
                raise
            except Exception as e:
                raise UnsupportedError(f"ExecuTorch lowering of graph {g.name} ({req.scheme.name}) failed: "
                                       f"{_first_line(e)}") from None
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


TARGET = ExecuTorchXnnpack()
COREML_TARGET = ExecuTorchCoreML()
