"""Target ``qdq_onnx``: a QDQ ONNX graph for the Qualcomm NPU, quantized with onnxruntime's QNN configuration.

Projections are rewritten as 1x1 convs first (per-channel int8 weights apply to Conv, not MatMul). Activation
ranges come from the calibration set captured from the fp32 pipeline; a scheme marked uncalibrated takes them from
random stand-in inputs instead (what a build without calibration data does). The same file runs on ORT CPU (the
parity runtime here) and is what AI Hub compiles; the ``qnn_context`` target compiles it for a named SoC.
"""
from __future__ import annotations

import contextlib
import io
import logging
import shutil
from pathlib import Path

import numpy as np

from ..errors import CalibrationError, MissingDependency, UnsupportedError
from ..runtimes.ort import ort_cpu
from . import Built, Execution, ExportRequest, Target
from .onnx_export import export_onnx, onnx_files
from .rewrites import linear_to_conv

ACT = {"uint16": "QUInt16", "uint8": "QUInt8"}
WEIGHT = {"int8": "QInt8", "int4": "QInt4"}
RANGE = {"minmax": "MinMax", "percentile": "Percentile", "entropy": "Entropy", "distribution": "Distribution"}
RANDOM_SAMPLES = 8


class _Reader:
    """ORT CalibrationDataReader over a stream of feeds."""

    def __init__(self, feeds):
        self.it = iter(feeds)

    def get_next(self):
        return next(self.it, None)

    def rewind(self):  # pragma: no cover - ORT calls it for some methods only
        raise CalibrationError("calibration stream cannot rewind")


def random_feeds(specs, seed: int = 0):
    rs = np.random.RandomState(seed)
    for _ in range(RANDOM_SAMPLES):
        yield {s.name: rs.standard_normal(s.shape).astype(np.float32) for s in specs}


def quantize_qdq(src: Path, dst: Path, feeds, scheme, init_overrides: dict | None = None,
                 ranges_cache: Path | None = None) -> None:
    """``init_overrides``: ORT tensor quant overrides (e.g. int16 for chosen weights); ``ranges_cache``: a JSON file
    of activation ranges, written by the first call and reused (no calibration pass) by later ones on ``src``."""
    try:
        from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantType, quantize_static
        from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config
    except ImportError:
        raise MissingDependency("onnxruntime quantization tools are not installed") from None
    if scheme.activations not in ACT or scheme.weights not in WEIGHT:
        raise UnsupportedError(f"scheme {scheme.name}: qdq_onnx supports weights {list(WEIGHT)} and activations {list(ACT)}")

    class Reader(_Reader, CalibrationDataReader):
        pass

    buf = io.StringIO()
    logging.getLogger().setLevel(logging.ERROR)
    with contextlib.redirect_stdout(buf):
        qc = get_qnn_qdq_config(str(src), Reader(feeds), calibrate_method=getattr(CalibrationMethod, RANGE[scheme.range_method]),
                                activation_type=getattr(QuantType, ACT[scheme.activations]),
                                weight_type=getattr(QuantType, WEIGHT[scheme.weights]),
                                per_channel=scheme.per_channel, weight_symmetric=True, init_overrides=init_overrides)
        quantize_static(str(src), str(dst), qc.calibration_data_reader, quant_format=qc.quant_format,
                        op_types_to_quantize=qc.op_types_to_quantize, per_channel=qc.per_channel,
                        reduce_range=qc.reduce_range, activation_type=qc.activation_type, weight_type=qc.weight_type,
                        nodes_to_quantize=qc.nodes_to_quantize, nodes_to_exclude=qc.nodes_to_exclude,
                        use_external_data_format=True, calibrate_method=qc.calibrate_method,
                        calibration_providers=qc.calibration_providers, extra_options=qc.extra_options,
                        calibration_cache_path=ranges_cache)


class QdqOnnx(Target):
    name, format, version = "qdq_onnx", "onnx-qdq", "1"
    schemes = ("w8a16", "w8a8", "w4a16_uncalibrated", "w8a16_percentile", "w8a16_entropy", "w8a16_uncalibrated",
               "w4a16", "w8a16_mixed")
    rewrites = ("linear_to_conv",)

    def export(self, req: ExportRequest, out: Path) -> Built:
        comp, scheme = req.component, req.scheme
        if scheme.calibrated and req.calibration is None:
            raise CalibrationError(f"scheme {scheme.name} is calibrated but no calibration set was given")
        files, mixed = {}, {}
        for g in comp.graphs():  # one graph at a time: only one graph's weights are in flight
            work = out / f".fp32-{g.name}"
            work.mkdir()
            src = export_onnx(linear_to_conv(g.module), g, work / "rewritten.onnx")
            if scheme.calibrated:
                feeds = (comp.graph_feeds(f)[g.name] for f in req.calibration)
            else:
                feeds = random_feeds(g.inputs)
            if scheme.mixed:
                from ..calibration.mixed import quantize_mixed
                mixed[g.name] = quantize_mixed(src, out / f"{g.name}.onnx", req.calibration,
                                               lambda f, g=g: comp.graph_feeds(f)[g.name], scheme, req.thresholds,
                                               g, comp, req.trace_set)
            else:
                quantize_qdq(src, out / f"{g.name}.onnx", feeds, scheme)
            shutil.rmtree(work)
            files.update(onnx_files(out / f"{g.name}.onnx", g.name))
        ranges = (f"calibration set {req.calibration.hash[:12]}" if scheme.calibrated
                  else f"{RANDOM_SAMPLES} random normal stand-in inputs")
        info = {"opset": 21, "rewrites": list(self.rewrites), "activation_ranges": ranges,
                "quantizer": "onnxruntime.quantization get_qnn_qdq_config", "weight_symmetric": True}
        if mixed:
            info["mixed_precision"] = mixed
        return Built(self.name, scheme.name, out, files, info)

    def execution(self, built, component, device) -> Execution:
        runners = {g.name: ort_cpu(built.path(g.name), [s.name for s in g.outputs]) for g in component.graphs()}
        return Execution("onnxruntime-cpu (QDQ)", component.chain(runners))


TARGET = QdqOnnx()
