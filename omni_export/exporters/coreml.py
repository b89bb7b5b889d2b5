"""Target ``coreml``: an ``.mlpackage`` (mlprogram) per component graph, converted from ``torch.export`` with
coremltools (the TorchScript path fails on these graphs).

Schemes: ``fp16`` (fp16 compute precision) and ``w8_fp16`` (the fp16 program with int8 per-channel symmetric weights,
``ct.optimize.coreml.linear_quantize_weights``). KV caches are explicit inputs and the new K/V rows outputs, the same
host loop as every other target; CoreML state is not used (it needs iOS 18 and caches held as in-graph buffers).

CoreML prediction exists only on macOS: on Linux the artifact is ``unverified`` with that reason; on macOS
``MLModel.predict`` executes the same file under the same parity code and gate.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from ..errors import MissingDependency, UnsupportedError
from ..lowering.torch_export import first_line, quiet_lowering
from .base import Built, Execution, ExportRequest, Target

DEPLOYMENT_TARGET = "iOS17"  # mlprogram with fp16 compute and int8 weight compression; no state needed
LINUX_REASON = ("CoreML prediction needs macOS (coremltools cannot execute an .mlpackage on Linux); "
                "run the same recipe on a Mac to gate it")


def _ct():
    try:
        import coremltools as ct
    except ImportError:
        raise MissingDependency("coremltools is not installed (pip install coremltools)") from None
    return ct


def convert(component, graph, scheme):
    """One component graph -> an in-memory mlprogram for ``scheme``, converted in the component's own form for this
    target where it has one (``Component.graph_for``; e.g. the Qwen3-TTS code predictor's stacked heads as one
    linear), else as it is."""
    ct = _ct()
    with quiet_lowering(), torch.no_grad():
        module = component.export_module("coreml", graph, scheme).eval()
        prog = torch.export.export(module, graph.example_inputs()).run_decompositions({})
        model = ct.convert(prog, convert_to="mlprogram", compute_precision=ct.precision.FLOAT16,
                           minimum_deployment_target=getattr(ct.target, DEPLOYMENT_TARGET),
                           inputs=[ct.TensorType(name=s.name, shape=s.shape, dtype=np.float32) for s in graph.inputs],
                           outputs=[ct.TensorType(name=s.name, dtype=np.float32) for s in graph.outputs])
        if scheme.weight_only and scheme.weights == "int8":  # w8_fp16
            from coremltools.optimize.coreml import (OpLinearQuantizerConfig, OptimizationConfig,
                                                     linear_quantize_weights)
            cfg = OpLinearQuantizerConfig(mode="linear_symmetric", dtype="int8", granularity="per_channel")
            model = linear_quantize_weights(model, OptimizationConfig(global_config=cfg))
    return model


def coreml_runner(path: Path, graph):
    """macOS only: a Runner over ``MLModel.predict`` (named numpy inputs -> outputs in the graph's order)."""
    ct = _ct()
    model = ct.models.MLModel(str(path), compute_units=ct.ComputeUnit.CPU_ONLY)
    names = [s.name for s in graph.outputs]

    def run(feed):
        res = model.predict({s.name: np.ascontiguousarray(feed[s.name], dtype=np.float32) for s in graph.inputs})
        return [np.asarray(res[n], dtype=np.float32).reshape(s.shape) for n, s in zip(names, graph.outputs)]

    return run


class CoreML(Target):
    name, format = "coreml", "coreml-mlpackage"
    schemes = ("fp16", "w8_fp16")

    def export(self, req: ExportRequest, out: Path) -> Built:
        files = {}
        for g in req.component.each_graph():
            try:
                model = convert(req.component, g, req.scheme)
            except (MissingDependency, UnsupportedError):
                raise
            except Exception as e:
                raise UnsupportedError(f"CoreML conversion of graph {g.name} ({req.scheme.name}) failed: "
                                       f"{first_line(e)}") from None
            model.save(str(out / f"{g.name}.mlpackage"))
            files[g.name] = f"{g.name}.mlpackage"
        info = {"model_type": "mlprogram", "converter": "coremltools ct.convert from torch.export",
                "compute_precision": "fp16", "minimum_deployment_target": DEPLOYMENT_TARGET,
                "weights": ("int8 per-channel symmetric (linear_quantize_weights)" if req.scheme.weight_only
                            else "fp16"),
                "kv_cache": "explicit cache inputs, new K/V rows as outputs (CoreML state not used)"}
        return Built(self.name, req.scheme.name, out, files, info)

    def execution(self, built, component, device) -> Execution:
        if sys.platform != "darwin":
            return Execution(None, unavailable=LINUX_REASON)
        runners = {g.name: coreml_runner(built.path(g.name), g) for g in component.graphs()}
        return Execution("coreml (MLModel.predict, CPU)", component.chain(runners))


TARGET = CoreML()
