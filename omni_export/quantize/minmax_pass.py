"""The min-max calibration pass: every calibrated tensor's range over the calibration samples, onnxruntime's
ranges computed in one session call per sample (or per batch of samples, ``calib_batch``), and the scale search's
Gram matrices gathered on the same calls. ``qdq`` quantizes with the ranges it writes."""
from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path

import numpy as np

from ..errors import CalibrationError, UnsupportedError
from ..runtimes.ort import cpu_session
from .calib_batch import FIRST_CALL_RTOL, batches, matching
from .minmax_graph import MinMaxGraph
from .scale_search import GramAccumulator, eligible_convs


class _Reader:
    """``get_next()`` over an iterable of feeds (None at its end)."""

    def __init__(self, feeds):
        self.it = iter(feeds)

    def get_next(self):
        return next(self.it, None)


def calibrate_minmax(src: Path, reader, cache: Path, op_types, providers, extra_options: dict,
                     gram_file: Path | None = None, gram_skip=(), batched=None, outputs=None) -> None:
    """Min-max activation ranges, onnxruntime's exactly (the tensors its ``MinMaxCalibrater`` selects, its
    ReduceMin/ReduceMax -> Reshape outputs, merged sample by sample as its ``collect_data`` merges; checked equal to
    its one-shot ranges in ``tests/quantize/test_qdq_calibration.py``), written as an ORT ranges cache. Each sample
    is run, merged and dropped (``quantize_static`` keeps every sample's outputs to the end). Unlike onnxruntime's
    calibrator, the augmented graph is written beside ``src`` reading ``src``'s weight file, not with a copy of every
    weight, tensors are reduced in groups of one shape soon after they are made (``minmax_graph``), and the minima
    (maxima) are joined into one output per dtype and merged elementwise, the same ranges. ``gram_file``:
    also the Gram matrix of every input of a projection whose weight is not in ``gram_skip`` (those keep another
    precision) over the same samples (``scale_search``), saved there. ``batched``: ``(B, make)``, ``make()`` writing
    ``src``'s graph at batch B and returning its path: B samples per call, the samples left over at batch 1
    (``calib_batch``); how the pass ran is written beside ``cache`` (``batch_note``). ``outputs``: ``(names, into)``,
    each sample's values of those graph outputs appended to the list ``into`` in sample order (a chained component's
    next graph calibrates on them: ``StagedFeeds.advance``), from the same calls."""
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData, save_tensors_data

    opts = extra_options or {}
    if opts.get("CalibMovingAverage"):
        raise UnsupportedError("moving-average min-max calibration is not supported (ranges are global min/max)")
    symmetric = bool(opts.get("CalibTensorRangeSymmetric", False))
    src = Path(src)
    model, value_infos, chosen = calibrated_tensors(src, op_types)
    grams = GramAccumulator(eligible_convs(model, gram_skip).values()) if gram_file is not None else None
    passes, note, stream = [], {"samples_per_call": 1}, reader
    if batched is not None and batched[0] > 1:
        passes, note, stream = _batched_pass(batched, model, src, chosen, value_infos, reader, symmetric, grams,
                                             providers, outputs)
    if not passes or note["samples"] > passes[0][2] * note["samples_per_call"]:
        passes.append(_minmax_pass(model, src, chosen, value_infos, stream, symmetric, grams, providers,
                                   outputs=outputs))
    if sum(p[2] for p in passes) == 0:
        raise CalibrationError("the calibration stream is empty: no activation ranges")
    ranges = {}
    for lo, hi, n in passes:  # per tensor, the passes merged as samples are: min(lo, a), as Python's min picks
        if n:
            for t in lo:
                a, b_ = lo[t], hi[t]
                if t in ranges:
                    a, b_ = np.where(a < ranges[t][0], a, ranges[t][0]), np.where(b_ > ranges[t][1], b_, ranges[t][1])
                ranges[t] = (a, b_)
    note.setdefault("samples", sum(p[2] for p in passes))
    save_tensors_data(TensorsData(CalibrationMethod.MinMax, {t: TensorData(lowest=lo, highest=hi)
                                                               for t, (lo, hi) in ranges.items()}), cache)
    batch_note(cache).write_text(json.dumps(note, sort_keys=True))
    if grams is not None:
        grams.save(gram_file)


class _Refused(Exception):
    """The batched copy's first call does not give its samples' ranges: the pass runs one sample a call."""


def _batched_pass(batched, model, src, chosen, value_infos, reader, symmetric, grams, providers, outputs=None):
    """The pass at ``batched = (B, make)``: ``(passes, note, stream)``, ``stream`` the samples left for the
    batch-1 graph. The copy is used only when its tensors hold B times the elements (``calib_batch.matching``) and
    its first call gives every tensor the range the batch-1 graph gives the same B samples (a graph that mixes the
    rows of a batch fails here; checked before the call's rows reach ``grams``); otherwise every sample runs at
    batch 1, with the reason in the note."""
    b, rest, first = batched[0], [], []
    while len(first) < b and (feed := reader.get_next()) is not None:
        first.append(feed)
    whole = _Reader(itertools.chain(first, iter(reader.get_next, None)))
    if len(first) < b:
        return [], {"samples_per_call": 1}, whole
    try:
        bsrc = Path(batched[1]())
    except Exception as e:  # noqa: BLE001 - the copy is an optimization; the batch-1 pass is the reference path
        return [], {"samples_per_call": 1, "batch_refused": f"batch-{b} copy not built: {type(e).__name__}: "
                    f"{str(e).splitlines()[0] if str(e) else ''}"}, whole
    bmodel, binfos = _with_shapes(bsrc)
    why = matching(chosen, value_infos, binfos, b)
    if why is None:
        one = _minmax_pass(copy.deepcopy(model), src, chosen, value_infos, _Reader(first), symmetric, None, providers)

        def check(lo, hi):
            for t in sorted(lo):
                ref = np.concatenate([one[0][t], one[1][t]])
                scale = max(float(np.abs(ref).max()), 1e-6)
                if float(np.abs(np.concatenate([lo[t], hi[t]]) - ref).max()) > FIRST_CALL_RTOL * scale:
                    raise _Refused(f"tensor {t}: range {[float(lo[t][0]), float(hi[t][0])]} in one call of "
                                   f"{b} samples, {[float(one[0][t][0]), float(one[1][t][0])]} one at a time")
        try:
            stack = _Reader(itertools.chain(batches(_Reader(first), b, []), batches(reader, b, rest)))
            p = _minmax_pass(bmodel, bsrc, chosen, binfos, stack, symmetric, grams, providers, check, outputs, b)
            return [p], {"samples_per_call": b, "samples": p[2] * b + len(rest)}, _Reader(rest)
        except _Refused as e:
            why = str(e)
    return [], {"samples_per_call": 1, "batch_refused": why}, whole


def calibrated_tensors(src: Path, op_types):
    """``(model, value_infos, tensors)``: ``src`` without its weights, its inferred value infos and the tensors a
    calibration pass ranges (onnxruntime's ``select_tensors_to_calibrate``)."""
    from onnx import TensorProto

    model, value_infos = _with_shapes(Path(src))
    inits = {t.name for t in model.graph.initializer}
    chosen = set()
    for n in model.graph.node:
        if not op_types or n.op_type in op_types:
            for t in list(n.input) + list(n.output):
                vi = value_infos.get(t)
                if (vi is not None and vi.type.HasField("tensor_type") and t not in inits
                        and vi.type.tensor_type.elem_type in (TensorProto.FLOAT, TensorProto.FLOAT16)):
                    chosen.add(t)
    return model, value_infos, chosen


def batch_note(cache: Path) -> Path:
    """How a calibration pass ran (samples per call; why it stayed at batch 1): beside its ranges file."""
    return Path(cache).with_name(Path(cache).stem + ".batch.json")


def _with_shapes(path: Path):
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    inferred = onnx.shape_inference.infer_shapes(model).graph
    value_infos = {vi.name: vi for vi in inferred.value_info}
    value_infos.update({o.name: o for o in inferred.output})
    value_infos.update({i.name: i for i in inferred.input})
    return model, value_infos


def _minmax_pass(model, src: Path, chosen: set, value_infos: dict, reader, symmetric: bool, grams, providers,
                 check=None, outputs=None, batch: int = 1):
    """One session over ``reader``'s feeds on ``model`` (loaded from ``src``, changed in place) with the reductions
    of ``chosen``: ``(lowest, highest, calls)``, per tensor name. ``check(lowest, highest)``: called with the first
    call's ranges, before they are merged; it may raise. ``outputs``: ``(names, into)`` as ``calibrate_minmax``'s,
    a call of ``batch`` samples split into ``batch`` entries."""
    import onnx
    from onnx import TensorProto, helper

    g = model.graph
    outputs = outputs if outputs and outputs[0] else None  # no names: nothing to hand on
    aug_graph = MinMaxGraph(model, chosen, value_infos)  # every range in two outputs per dtype
    by_dtype = aug_graph.order
    joined = [MinMaxGraph.output(op, d) for d in by_dtype for op in ("ReduceMin", "ReduceMax")]
    for t in grams.tensors if grams else ():
        g.output.append(helper.make_tensor_value_info(t, TensorProto.FLOAT, None))
    aug = src.with_name(src.stem + ".minmax.onnx")  # beside src: its weights stay in src's data file
    onnx.save(model, str(aug))
    lo, hi, n = {}, {}, 0
    try:
        sess = cpu_session(aug, optimize=False, providers=providers)  # no graph optimization, as onnxruntime's
        names = joined + (grams.tensors if grams else [])
        names += [t for t in (outputs[0] if outputs else ()) if t not in names]
        while (feed := reader.get_next()) is not None:
            vals = dict(zip(names, sess.run(names, feed)))
            call = {}
            for d in by_dtype:  # element i is tensor i's range
                a, b = vals[MinMaxGraph.output("ReduceMin", d)], vals[MinMaxGraph.output("ReduceMax", d)]
                if symmetric:
                    m = np.nanmax([np.abs(a), np.abs(b)], axis=0)
                    a, b = -m, m
                call[d] = a, b
            if check is not None and n == 0:
                check(*_per_tensor({d: a for d, (a, _) in call.items()}, {d: b for d, (_, b) in call.items()},
                                   by_dtype))
            if outputs and batch == 1:
                outputs[1].append({t: vals[t] for t in outputs[0]})
            elif outputs:  # a batched call's outputs, sample by sample; None where one is not split by samples
                split = all(vals[t].shape[:1] == (batch,) for t in outputs[0])
                outputs[1].extend({t: vals[t][i:i + 1] for t in outputs[0]} if split else None for i in range(batch))
            if grams is not None:
                grams.add(vals)
            for d, (a, b) in call.items():  # onnxruntime's merge_range, elementwise
                lo[d] = a if d not in lo else np.where(a < lo[d], a, lo[d])  # min(lo, a), as Python's min picks
                hi[d] = b if d not in hi else np.where(b > hi[d], b, hi[d])
            n += 1
        del sess
    finally:
        aug.unlink(missing_ok=True)
    if n == 0:
        return {}, {}, 0
    return (*_per_tensor(lo, hi, by_dtype), n)


def _per_tensor(lo: dict, hi: dict, by_dtype: dict):
    """Per dtype arrays (element i: tensor i of that dtype) -> ``(lowest, highest)`` per tensor name."""
    return ({t: lo[d][i:i + 1].copy() for d, ts in by_dtype.items() for i, t in enumerate(ts)},
            {t: hi[d][i:i + 1].copy() for d, ts in by_dtype.items() for i, t in enumerate(ts)})
