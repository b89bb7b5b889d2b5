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


def quantize_qdq(src: Path, dst: Path, feeds, scheme) -> None:
    try:
        from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantType, quantize
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
                                per_channel=scheme.per_channel, weight_symmetric=True)
        qc.use_external_data_format = True
        quantize(str(src), str(dst), qc)


class QdqOnnx(Target):
    name, format, version = "qdq_onnx", "onnx-qdq", "1"
    schemes = ("w8a16", "w8a8", "w4a16_uncalibrated")
    rewrites = ("linear_to_conv",)

    def export(self, req: ExportRequest, out: Path) -> Built:
        comp, scheme = req.component, req.scheme
        fp32 = out / "fp32"
        fp32.mkdir()
        src = export_onnx(linear_to_conv(comp.module), comp, fp32 / "rewritten.onnx")
        if scheme.calibrated:
            if req.calibration is None:
                raise CalibrationError(f"scheme {scheme.name} is calibrated but no calibration set was given")
            feeds, ranges = iter(req.calibration), f"calibration set {req.calibration.hash[:12]}"
        else:
            feeds, ranges = random_feeds(comp.input_specs()), f"{RANDOM_SAMPLES} random normal stand-in inputs"
        quantize_qdq(src, out / "model.onnx", feeds, scheme)
        for f in fp32.iterdir():
            f.unlink()
        fp32.rmdir()
        info = {"opset": 21, "rewrites": list(self.rewrites), "activation_ranges": ranges,
                "quantizer": "onnxruntime.quantization get_qnn_qdq_config", "weight_symmetric": True}
        return Built(self.name, scheme.name, out, onnx_files(out / "model.onnx"), info)

    def execution(self, built, component, device) -> Execution:
        names = [s.name for s in component.output_specs()]
        return Execution("onnxruntime-cpu (QDQ)", ort_cpu(built.path(), names))


TARGET = QdqOnnx()
