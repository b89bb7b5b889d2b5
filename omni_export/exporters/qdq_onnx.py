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
import tempfile
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


def source_module(comp, graph, scheme):
    """The fp32 module a QDQ build of ``scheme`` exports and quantizes for ``graph``: projections as 1x1 convs, then
    the component's own QDQ form (``Component.qdq_module``). Whatever compares against a QDQ graph tensor by tensor
    exports this same module."""
    return comp.qdq_module(graph.name, linear_to_conv(graph.module), scheme)


def quantize_qdq(src: Path, dst: Path, feeds, scheme, init_overrides: dict | None = None,
                 ranges_cache: Path | None = None, range_margin: float = 1.0) -> None:
    """``init_overrides``: ORT tensor quant overrides (e.g. int16 for chosen weights); ``ranges_cache``: a JSON file
    of activation ranges, written by the first call and reused (no calibration pass) by later ones on ``src``;
    ``range_margin``: every calibrated activation range widened away from zero by this factor before quantizing
    (a component's ``qdq_policy``; 1.0 = the ranges as calibrated, one pass as before)."""
    if range_margin != 1.0:
        with tempfile.TemporaryDirectory(prefix="omni-ranges-") as td:
            cache = Path(td) / "ranges.json"
            _quantize(src, Path(td) / dst.name, feeds, scheme, init_overrides, cache)  # calibrates, writes the cache
            widen_ranges(cache, range_margin, clip_bounds(src))
            _quantize(src, dst, iter(()), scheme, init_overrides, cache)
        return
    _quantize(src, dst, feeds, scheme, init_overrides, ranges_cache)


def int16_weights(names) -> dict | None:
    """ORT tensor quant overrides putting the named weights at int16 (symmetric, per output channel): W16A16, a
    precision the HTP runs."""
    from onnxruntime.quantization import QuantType
    return {w: [{"quant_type": QuantType.QInt16, "axis": 0, "symmetric": True}] for w in names} or None


def clip_bounds(src: Path) -> dict[str, tuple[float, float]]:
    """Output name -> (min, max) of every Clip with constant bounds: its range is the op's, not the data's (the
    quantizer folds such a Clip into its input's range, so a widened range would drop the clamp)."""
    import onnx
    from onnx import numpy_helper
    g = onnx.load(str(src), load_external_data=False).graph
    consts = {i.name: i for i in g.initializer}
    consts.update({n.output[0]: n.attribute[0].t for n in g.node if n.op_type == "Constant" and n.attribute
                   and n.attribute[0].name == "value"})
    out = {}
    for n in g.node:
        if n.op_type == "Clip" and len(n.input) == 3 and n.input[1] in consts and n.input[2] in consts:
            out[n.output[0]] = (float(numpy_helper.to_array(consts[n.input[1]])),
                                float(numpy_helper.to_array(consts[n.input[2]])))
    return out


def widen_ranges(cache: Path, margin: float, bounds: dict[str, tuple[float, float]] | None = None) -> None:
    """Scale every range in an ORT calibration cache away from zero by ``margin``: a negative lowest and a positive
    highest grow, a bound at or across zero on the other side stays (a non-negative tensor keeps 0 as its floor).
    ``bounds``: tensors whose range is fixed by their op (``clip_bounds``) are kept within it."""
    from onnxruntime.quantization.calibrate import TensorData, load_tensors_data, save_tensors_data
    if margin < 1.0:
        raise UnsupportedError(f"an activation range margin below 1 ({margin}) would clip calibrated values")
    ranges = load_tensors_data(cache)
    for name, t in list(ranges.items()):
        lo, hi = t.range_value
        lo, hi = np.where(lo < 0, lo * margin, lo).astype(lo.dtype), np.where(hi > 0, hi * margin, hi).astype(hi.dtype)
        if name in (bounds or {}):
            lo = np.maximum(lo, bounds[name][0]).astype(lo.dtype)
            hi = np.minimum(hi, bounds[name][1]).astype(hi.dtype)
        ranges[name] = TensorData(lowest=lo, highest=hi)
    save_tensors_data(ranges, cache)


def _quantize(src: Path, dst: Path, feeds, scheme, init_overrides: dict | None, ranges_cache: Path | None) -> None:
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
    with contextlib.redirect_stdout(buf), contextlib.ExitStack() as stack:
        qc = get_qnn_qdq_config(str(src), Reader(feeds), calibrate_method=getattr(CalibrationMethod, RANGE[scheme.range_method]),
                                activation_type=getattr(QuantType, ACT[scheme.activations]),
                                weight_type=getattr(QuantType, WEIGHT[scheme.weights]),
                                per_channel=scheme.per_channel, weight_symmetric=True, init_overrides=init_overrides)
        if scheme.range_method == "minmax" and not (ranges_cache is not None and Path(ranges_cache).is_file()):
            # min-max ranges merged sample by sample before the quantizer loads the model (see calibrate_minmax)
            if ranges_cache is None:
                ranges_cache = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="omni-ranges-"))) / "r.json"
            calibrate_minmax(src, qc.calibration_data_reader, ranges_cache, qc.op_types_to_quantize,
                             qc.calibration_providers, qc.extra_options)
        quantize_static(str(src), str(dst), qc.calibration_data_reader, quant_format=qc.quant_format,
                        op_types_to_quantize=qc.op_types_to_quantize, per_channel=qc.per_channel,
                        reduce_range=qc.reduce_range, activation_type=qc.activation_type, weight_type=qc.weight_type,
                        nodes_to_quantize=qc.nodes_to_quantize, nodes_to_exclude=qc.nodes_to_exclude,
                        use_external_data_format=True, calibrate_method=qc.calibrate_method,
                        calibration_providers=qc.calibration_providers, extra_options=qc.extra_options,
                        calibration_cache_path=ranges_cache)


def calibrate_minmax(src: Path, reader, cache: Path, op_types, providers, extra_options: dict) -> None:
    """onnxruntime's min-max calibrator, fed one sample at a time: each sample's reduced min/max are merged into the
    running ranges and its outputs dropped (``quantize_static`` keeps every sample's outputs until the end, and
    its ``CalibMaxIntermediateOutputs`` discards data in onnxruntime 1.32). Runs before the quantizer loads the
    model, so the augmented session and the quantizer are never in memory together. Writes an ORT ranges cache."""
    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator, save_tensors_data

    class One:
        def __init__(self, feed):
            self.feed = feed

        def get_next(self):
            f, self.feed = self.feed, None
            return f

    keys = (("CalibTensorRangeSymmetric", "symmetric"), ("CalibMovingAverage", "moving_average"),
            ("CalibMovingAverageConstant", "averaging_constant"))
    opts = {k: extra_options[n] for n, k in keys if n in (extra_options or {})}
    with tempfile.TemporaryDirectory(prefix="omni-calib-") as td:
        cal = create_calibrator(Path(src), op_types, augmented_model_path=str(Path(td) / "augmented.onnx"),
                                calibrate_method=CalibrationMethod.MinMax, use_external_data_format=True,
                                providers=providers, extra_options=opts)
        cal.model = None  # the augmented model is saved and its session open: its in-memory copy is not used again
        n = 0
        while (feed := reader.get_next()) is not None:
            cal.collect_data(One(feed))  # runs the sample, merges its min/max into the running ranges, clears
            n += 1
        if n == 0:
            raise CalibrationError("the calibration stream is empty: no activation ranges")
        ranges = cal.compute_data()
        del cal
    save_tensors_data(ranges, cache)


class QdqOnnx(Target):
    name, format, version = "qdq_onnx", "onnx-qdq", "1"
    schemes = ("w8a16", "w8a8", "w4a16_uncalibrated", "w8a16_percentile", "w8a16_entropy", "w8a16_uncalibrated",
               "w4a16", "w8a16_mixed")
    rewrites = ("linear_to_conv",)

    def export(self, req: ExportRequest, out: Path) -> Built:
        comp, scheme = req.component, req.scheme
        if scheme.calibrated and req.calibration is None:
            raise CalibrationError(f"scheme {scheme.name} is calibrated but no calibration set was given")
        files, mixed, policies = {}, {}, {}
        staged = comp.staged_feeds(req.calibration) if scheme.calibrated and not scheme.mixed else None
        for g in comp.each_graph():  # one graph at a time: only one graph's weights are in flight
            work = out / f".fp32-{g.name}"
            work.mkdir()
            module = source_module(comp, g, scheme)
            src = export_onnx(module, g, work / "rewritten.onnx")
            comp.release_weights()  # the graph is on disk; calibration and quantization read the ONNX file
            policy = comp.qdq_policy(g.name, module, scheme)  # what this component keeps wider or at int16, and why
            if scheme.mixed:
                from ..calibration.mixed import quantize_mixed
                mixed[g.name] = quantize_mixed(src, out / f"{g.name}.onnx", req.calibration,
                                               lambda f, g=g: comp.graph_feeds(f, g.name)[g.name], scheme, req.thresholds,
                                               g, comp, req.trace_set)
            else:
                feeds = staged.feeds(g) if staged is not None else random_feeds(g.inputs)
                quantize_qdq(src, out / f"{g.name}.onnx", feeds, scheme,
                             int16_weights(policy["int16_weights"]) if policy else None,
                             range_margin=policy["range_margin"] if policy else 1.0)
                if policy:
                    policies[g.name] = policy["record"]
            shutil.rmtree(work)
            if staged is not None:
                staged.advance(g)  # the next graph's calibration inputs, from this graph's eager fp32 outputs
            files.update(onnx_files(out / f"{g.name}.onnx", g.name))
        ranges = (f"calibration set {req.calibration.hash[:12]}" if scheme.calibrated
                  else f"{RANDOM_SAMPLES} random normal stand-in inputs")
        info = {"opset": 21, "rewrites": list(self.rewrites), "activation_ranges": ranges,
                "quantizer": "onnxruntime.quantization get_qnn_qdq_config", "weight_symmetric": True}
        if mixed:
            info["mixed_precision"] = mixed
        if policies:
            info["component_policy"] = policies
        return Built(self.name, scheme.name, out, files, info)

    def execution(self, built, component, device) -> Execution:
        runners = {g.name: ort_cpu(built.path(g.name), [s.name for s in g.outputs]) for g in component.graphs()}
        return Execution("onnxruntime-cpu (QDQ)", component.chain(runners))


TARGET = QdqOnnx()
