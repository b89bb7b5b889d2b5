"""QDQ quantization with onnxruntime's QNN configuration: per-channel weight scales computed vectorized, min-max
activation ranges merged sample by sample, optional widened ranges and int16 weights. The ``qdq_onnx`` target and the
mixed-precision pass (``mixed``) quantize through these."""
from __future__ import annotations

import contextlib
import io
import json
import logging
import shutil
import tempfile
from pathlib import Path

import numpy as np

from ..artifacts.hashing import hash_file, hash_many, hash_value
from ..artifacts.onnx_external import beside_the_model
from ..errors import CalibrationError, MissingDependency, UnsupportedError
from ..lowering.onnx_rewrites import read_initializer
from .histogram_pass import calibrate_histogram
from .minmax_pass import batch_note, calibrate_minmax
from .quantizer_rewiring import indexed_rewiring
from .scale_search import by_row_halves, eligible_convs, gram_path, load_grams, search_scales

ACT = {"uint16": "QUInt16", "uint8": "QUInt8"}
WEIGHT = {"int8": "QInt8", "int4": "QInt4"}
WEIGHT_TYPES = {**WEIGHT, "int16": "QInt16"}  # WEIGHT plus the int16 a component policy keeps some weights at
RANGE = {"minmax": "MinMax", "percentile": "Percentile", "entropy": "Entropy", "distribution": "Distribution"}
HISTOGRAM = ("percentile", "entropy", "distribution")  # calibrated in chunks (histogram_pass)


class _Reader:
    """ORT CalibrationDataReader over a stream of feeds."""

    def __init__(self, feeds):
        self.it = iter(feeds)

    def get_next(self):
        return next(self.it, None)

    def rewind(self):  # pragma: no cover - ORT calls it for some methods only
        raise CalibrationError("calibration stream cannot rewind")


def weight_overrides(src: Path, scheme, min_real_range: float | None, skip=(), grams: dict | None = None,
                     record: dict | None = None, only=None, weights: str | None = None) -> dict:
    """ORT tensor quant overrides with each Conv weight's per-output-channel scale and zero point, computed here in
    one vectorized pass per weight: the same values onnxruntime's quantizer computes (``compute_data_quant_params``,
    symmetric, per channel; ``tests/exporters/test_onnx_rewrites.py`` checks the built graphs are identical), which
    it otherwise computes channel by channel in Python. ``skip``: weights
    with overrides of their own; ``min_real_range``: the quantizer's ``MinimumRealRange``, applied as it applies it.
    ``grams``: conv input tensor -> its calibration Gram matrix (``scale_search``); each projection whose input has
    one gets searched per-channel scales instead, and ``record`` (if given) says per weight how many channels were
    clipped and by how much. ``only``: just these weights; ``weights``: their type instead of the scheme's (``"int16"``:
    the policy's int16 weights, whose scales onnxruntime would otherwise compute channel by channel too)."""
    import onnx
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization.quant_utils import get_qmin_qmax_for_qType

    if not scheme.per_channel:
        return {}
    qtype = getattr(QuantType, WEIGHT_TYPES[weights or scheme.weights]).tensor_type
    qmin, qmax = get_qmin_qmax_for_qType(qtype, reduce_range=False, symmetric=True)
    model = onnx.load(str(src), load_external_data=False)
    inits = {t.name: t for t in model.graph.initializer}
    inputs = eligible_convs(model, skip) if grams else {}
    out = {}
    for n in model.graph.node:
        w = inits.get(n.input[1]) if n.op_type == "Conv" and len(n.input) > 1 else None
        if w is None or w.name in out or w.name in skip or w.data_type != onnx.TensorProto.FLOAT:
            continue
        if only is not None and w.name not in only:
            continue
        flat = np.asarray(read_initializer(w, src.parent)).reshape(w.dims[0], -1)
        rmin, rmax = np.minimum(flat.min(axis=1), np.float32(0)), np.maximum(flat.max(axis=1), np.float32(0))
        if min_real_range is not None:
            rmax = np.maximum(rmax, rmin + np.float32(min_real_range))
        absmax = np.maximum(np.abs(rmin), np.abs(rmax))
        scale = (absmax.astype(np.float64) * 2) / (float(qmax) - float(qmin))
        stored = np.where(scale < np.finfo(np.float32).tiny, 1.0, scale).astype(np.float32)
        if w.name in inputs and inputs[w.name] in grams:
            stored, ratio = search_scales(flat, grams[inputs[w.name]], int(qmin), int(qmax), absmax)
            if record is not None:
                record[w.name] = {"clipped_channels": int((ratio < 1).sum()), "channels": int(len(ratio)),
                                  "mean_ratio": round(float(ratio.mean()), 4)}
        zp = int(np.round((int(qmin) + int(qmax)) / 2.0))
        out[w.name] = [{"scale": float(s), "zero_point": zp} for s in stored]
        out[w.name][0]["axis"] = 0
        if weights is not None:
            out[w.name][0]["quant_type"] = getattr(QuantType, WEIGHT_TYPES[weights])
    return out


def _int16_scales(src: Path, scheme, overrides: dict, min_real_range: float | None) -> dict:
    """The int16 weights of ``overrides`` (``int16_weights``' form: symmetric, per output channel, no scale given) with
    their per-channel scales and zero points computed here in one vectorized pass, as ``weight_overrides`` computes
    the int8 ones: onnxruntime computes the same values channel by channel in Python (the QDQ graph is
    byte-identical, ``tests/exporters/test_onnx_rewrites.py``)."""
    from onnxruntime.quantization import QuantType
    wide = {w for w, v in overrides.items() if v == [{"quant_type": QuantType.QInt16, "axis": 0, "symmetric": True}]}
    if not wide or not scheme.per_channel:
        return {}
    return weight_overrides(src, scheme, min_real_range, only=wide, weights="int16")


def quantize_qdq(src: Path, dst: Path, feeds, scheme, init_overrides: dict | None = None,
                 ranges_cache: Path | None = None, range_margin: float = 1.0, exclude=(), fixed: dict | None = None) -> None:
    """``init_overrides``: ORT tensor quant overrides (e.g. int16 for chosen weights); ``ranges_cache``: a JSON file
    of activation ranges, written by the first call and reused (no calibration pass) by later ones on ``src``;
    ``range_margin``: every calibrated activation range widened away from zero by this factor before quantizing
    (a component's ``qdq_policy``; 1.0 = the ranges as calibrated, one pass as before); ``exclude``: node names
    left float (fp16 islands on the HTP); ``fixed``: activation overrides applied as given, after onnxruntime's
    mixed-precision fixer (which would convert a tensor of another type back to the default type for each of its
    consumers: the int16 MatMul inputs of ``policy.matmul_rhs_groups`` would reach their MatMul as uint16)."""
    if range_margin != 1.0:
        with tempfile.TemporaryDirectory(prefix="omni-ranges-") as td:
            cache = Path(td) / "ranges.json"
            # writes the cache (min-max calibrates only; another method's ranges come from a quantization pass)
            _quantize(src, None if scheme.range_method == "minmax" else Path(td) / dst.name, feeds, scheme,
                      init_overrides, cache, exclude)
            widen_ranges(cache, range_margin, clip_bounds(src))
            _quantize(src, dst, iter(()), scheme, init_overrides, cache, exclude, fixed)
        return
    _quantize(src, dst, feeds, scheme, init_overrides, ranges_cache, exclude, fixed)


def int16_weights(names) -> dict | None:
    """ORT tensor quant overrides putting the named weights at int16 (symmetric, per output channel): W16A16, a
    precision the HTP runs."""
    from onnxruntime.quantization import QuantType
    return {w: [{"quant_type": QuantType.QInt16, "axis": 0, "symmetric": True}] for w in names} or None


# ops whose output range is the op's own, whatever the data: a widened range there would only spend bits (on
# SmolLM2's decode step the built graphs measured the same with and without this: the QNN configuration already
# fixes these outputs' encodings; kept so that no margin can widen them)
BOUNDED_OPS = {"Sigmoid": (0.0, 1.0), "Softmax": (0.0, 1.0), "Tanh": (-1.0, 1.0)}


def clip_bounds(src: Path) -> dict[str, tuple[float, float]]:
    """Output name -> (min, max) of every Clip with constant bounds and every op of ``BOUNDED_OPS``: its range is the
    op's, not the data's (the quantizer folds such a Clip into its input's range, so a widened range would drop the
    clamp)."""
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
        elif n.op_type in BOUNDED_OPS:
            out[n.output[0]] = BOUNDED_OPS[n.op_type]
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


def _quantize(src: Path, dst: Path | None, feeds, scheme, init_overrides: dict | None, ranges_cache: Path | None,
              exclude=(), fixed: dict | None = None, search: bool = False, search_skip=(), memo=None,
              batched=None, outputs=None) -> None:
    """Calibrate (min-max: into ``ranges_cache`` unless it exists) and quantize ``src`` to ``dst``; ``dst`` None:
    calibrate only. ``search`` (calibrate only): also accumulate the projections' Gram matrices and write their
    searched per-channel weight scales beside the ranges (``scales_path``), for the quantization pass to apply.
    ``memo``: ``(key, build) -> directory`` of the store's finished steps, for the ranges (``memo_ranges``);
    ``batched``: ``(B, make)``, the calibration pass at B samples per call; ``outputs``: ``(names, into)``, graph
    outputs of every sample the pass ran (``calibrate_minmax``; nothing where no pass ran)."""
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
                                per_channel=scheme.per_channel, weight_symmetric=True, init_overrides=init_overrides,
                                nodes_to_exclude=list(exclude) or None)
        fast = weight_overrides(src, scheme, qc.extra_options.get("MinimumRealRange"), skip=init_overrides or ())
        if fast:  # per-channel weight scales computed here, vectorized; merged where onnxruntime reads overrides
            ovr = qc.extra_options.setdefault("TensorQuantOverrides", {})
            ovr.update({k: v for k, v in fast.items() if k not in ovr})
        wide = _int16_scales(src, scheme, qc.extra_options.get("TensorQuantOverrides") or {},
                             qc.extra_options.get("MinimumRealRange"))
        if wide:
            qc.extra_options["TensorQuantOverrides"].update(wide)
        if fixed:  # a ``convert`` alone (``policy.rhs_overrides``) joins what the tensor has already
            ovr = qc.extra_options.setdefault("TensorQuantOverrides", {})
            ovr.update({t: [{**ovr.get(t, [{}])[0], **v[0]}] if set(v[0]) == {"convert"} else v
                        for t, v in fixed.items()})
        ours = scheme.range_method == "minmax" or scheme.range_method in HISTOGRAM  # ranges computed here
        if ours and not (ranges_cache is not None and Path(ranges_cache).is_file()):
            if ranges_cache is None:
                ranges_cache = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="omni-ranges-"))) / "r.json"
            if scheme.range_method == "minmax":
                # min-max ranges merged sample by sample before the quantizer loads the model (see calibrate_minmax)
                def calibrate(cache: Path, grams: Path | None = None) -> None:
                    calibrate_minmax(src, qc.calibration_data_reader, cache, qc.op_types_to_quantize,
                                     qc.calibration_providers, qc.extra_options, grams,
                                     set(search_skip) | set(init_overrides or ()), batched, outputs)
                memo_ranges(memo, src, qc, calibrate, ranges_cache, gram_path(ranges_cache) if search else None,
                            batched[0] if batched else 1)
            else:  # onnxruntime's histogram calibrator, fed in chunks (histogram_pass): its one call keeps every sample
                calibrate_histogram(src, qc.calibration_data_reader, ranges_cache, qc.calibrate_method,
                                    qc.op_types_to_quantize, qc.calibration_providers, qc.extra_options)
        if dst is None:
            if search:
                record: dict = {}
                found = weight_overrides(src, scheme, qc.extra_options.get("MinimumRealRange"),
                                         skip=set(search_skip) | set(init_overrides or ()),
                                         grams=load_grams(gram_path(ranges_cache)),
                                         record=record)
                scales_path(ranges_cache).write_text(json.dumps(
                    {"overrides": {k: v for k, v in found.items() if k in record}, "record": record}))
            return
        with indexed_rewiring(), _vectorized_weight_quantization(), beside_the_model():
            quantize_static(str(src), str(dst), qc.calibration_data_reader, quant_format=qc.quant_format,
                            op_types_to_quantize=qc.op_types_to_quantize, per_channel=qc.per_channel,
                            reduce_range=qc.reduce_range, activation_type=qc.activation_type, weight_type=qc.weight_type,
                            nodes_to_quantize=qc.nodes_to_quantize, nodes_to_exclude=qc.nodes_to_exclude,
                            use_external_data_format=True, calibrate_method=qc.calibrate_method,
                            calibration_providers=qc.calibration_providers, extra_options=qc.extra_options,
                            calibration_cache_path=ranges_cache)


def _quantize_rows(w: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, lo, hi, out: np.ndarray) -> None:
    """``out = clip(round(w / scale) + zero_point, lo, hi)`` per leading row, in float32 as onnxruntime's
    ``quantize_nparray`` computes each channel (the same operations on the same dtypes, so the same bits)."""
    t = w / scale.reshape(-1, *([1] * (w.ndim - 1)))
    np.round(t, out=t)
    t += zero_point.reshape(-1, *([1] * (w.ndim - 1)))
    np.clip(t, lo, hi, out=t)
    out[...] = t


def _per_channel_initializer(original):
    """onnxruntime's ``quantize_onnx_initializer`` with its per-channel integer case (axis 0, 8- or 16-bit: every
    projection weight here) computed for all channels at once, in two threads over the rows (numpy releases the GIL),
    instead of one ``quantize_nparray`` call per channel; any other case is onnxruntime's own. The quantized
    initializers are byte-identical (``tests/exporters/test_onnx_rewrites.py``)."""
    import onnx
    from onnxruntime.quantization.quant_utils import (TENSOR_NAME_QUANT_SUFFIX, get_qmin_qmax_for_qType,
                                                      tensor_proto_to_array)
    ints = (onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT16, onnx.TensorProto.UINT16)

    def quantize(weight, quant_type, zero_point, scale, axis=None, quant_weight_name=None, block_size=0):
        if quant_type not in ints or axis != 0 or block_size or len(weight.dims) < 1:
            return original(weight, quant_type, zero_point, scale, axis, quant_weight_name, block_size)
        w = tensor_proto_to_array(weight)
        if w.dtype != np.float32 or np.shape(scale) != (w.shape[0],) or np.shape(zero_point) != (w.shape[0],):
            return original(weight, quant_type, zero_point, scale, axis, quant_weight_name, block_size)
        qmin, qmax = get_qmin_qmax_for_qType(quant_type, reduce_range=False, symmetric=False)
        q = np.empty(w.shape, onnx.helper.tensor_dtype_to_np_dtype(quant_type))
        scale, zero_point = np.asarray(scale), np.asarray(zero_point)
        by_row_halves(w.shape[0], lambda r: _quantize_rows(w[r], scale[r], zero_point[r], qmin, qmax, q[r]),
                      w.shape[0] >= 64)
        name = quant_weight_name if quant_weight_name else f"{weight.name}{TENSOR_NAME_QUANT_SUFFIX}"
        return onnx.numpy_helper.from_array(q.reshape(tuple(weight.dims)), name)
    return quantize


@contextlib.contextmanager
def _vectorized_weight_quantization():
    """While quantizing, onnxruntime's quantizer quantizes per-channel weights with ``_per_channel_initializer``."""
    import onnxruntime.quantization.qdq_quantizer as qdq

    saved = qdq.quantize_onnx_initializer
    qdq.quantize_onnx_initializer = _per_channel_initializer(saved)
    try:
        yield
    finally:
        qdq.quantize_onnx_initializer = saved


def memo_ranges(memo, src: Path, qc, calibrate, cache: Path, grams: Path | None, batch: int = 1) -> None:
    """Min-max ranges of ``src`` into ``cache`` through ``calibrate(cache, grams)``, shared through ``memo`` (the
    store's finished steps; None: just calibrate). The ranges depend only on the graph (its file and weights), the
    samples (the exporter's key names the calibration set and graph), which tensors are calibrated how and how many
    samples a call takes (``batch``: a batched matmul may round the last bit differently), so two schemes quantizing
    the same graph on the same set (w8a16 and w8a8 of one sweep) make one pass between them. A pass that also needs
    the Gram matrices (``grams``) runs in full and leaves its ranges for the next."""
    if memo is None:
        calibrate(cache, grams)
        return
    import onnx

    model = onnx.load(str(src), load_external_data=False)
    data = sorted({e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"})
    key = {"graph": hash_file(src), "graph_weights": dict(zip(data, hash_many(src.parent / d for d in data))),
           "tensors": hash_value(sorted(qc.op_types_to_quantize or ())),
           "symmetric": bool((qc.extra_options or {}).get("CalibTensorRangeSymmetric", False)),
           "samples_per_call": batch}
    files = ((cache, "ranges.json"), (batch_note(cache), "ranges.batch.json"))
    if grams is not None:
        calibrate(cache, grams)
        memo(key, lambda out: [shutil.copyfile(f, out / name) for f, name in files])
    else:
        d = memo(key, lambda out: calibrate(out / "ranges.json"))
        for f, name in files:
            shutil.copyfile(d / name, f)


def scales_path(ranges_cache: Path) -> Path:
    """Where a calibration pass's searched weight scales live: beside its activation ranges."""
    return Path(ranges_cache).with_name(Path(ranges_cache).stem + ".scales.json")


def calibrate_part(src: Path, feeds, scheme, cache: Path, search: bool = False, skip=(), memo=None,
                   batched=None, outputs=None) -> dict | None:
    """Min-max activation ranges of ``src`` into ``cache`` (an ORT ranges file), without quantizing. ``search``:
    with every int8 projection's per-channel scales searched on the same samples (``scale_search``; ``skip``: weights
    kept at another precision), returned as ``{"overrides": ORT tensor overrides, "record": per weight}``;
    ``memo``: the ranges shared with other builds of the same graph and samples (``memo_ranges``); ``batched``:
    ``(B, make)``, B samples per call of the pass (``calib_batch``); ``outputs``: ``(names, into)``, the graph
    outputs of each sample the pass ran (none when the ranges came from ``memo``)."""
    _quantize(Path(src), None, feeds, scheme, None, Path(cache), search=search, search_skip=skip, memo=memo,
              batched=batched, outputs=outputs)
    return json.loads(scales_path(cache).read_text()) if search else None


def quantize_part(src: Path, dst: Path, feeds, scheme, init_overrides: dict | None, range_margin: float,
                  ranges_cache: Path | None = None, exclude=(), fixed: dict | None = None) -> None:
    """One part's calibration and quantization (``quantize_qdq``), then its fp32 source directory removed: the unit
    of work ``PartPool`` runs in a worker."""
    quantize_qdq(Path(src), Path(dst), iter(feeds), scheme, init_overrides, ranges_cache, range_margin, exclude, fixed)
    shutil.rmtree(Path(src).parent)
