"""The mixed-precision pass of the ``qdq_onnx`` target (``w8a16_mixed``): raise the most sensitive weights to int16
until the gate's thresholds hold.

Selection never sees the parity prompts: candidates are driven by the component's host loop over the calibration
prompts and judged with the gate's own metrics and thresholds. Layers are ranked by their isolated weight SNR on
calibration samples (``sensitivity``), and the smallest prefix of that ranking whose build clears every threshold
is kept (doubling, then bisection), with a margin on SNR bars.
The gate then judges the chosen build on the parity prompts like any other artifact. If even every weight at int16
misses a threshold on the calibration prompts, the export is refused.

Through the ``qdq_onnx`` target (``search_parts``) every candidate is the component's shipped ``w8a16`` policy
(``Component.qdq_policy``: its int16 weights, searched scales, range margin, float islands) with more weights
raised. A component of several graphs (a full-size decode step in parts) is searched part by part: each part's
candidates run chained with the other parts in fp32, aiming at the bars tightened for the parts' errors adding up
(SNR bars + 10 log10(parts) dB, KLD bars / parts), with every tensor that crosses a part boundary carrying the one
encoding all parts share. The parts chosen are then judged together, on the calibration prompts, against the
bars themselves; a combination that misses them is refused.

int16 weights with 16-bit activations is a precision the HTP runs (W16A16); the activation ranges are computed once
and reused for every candidate, so a candidate costs one quantization pass, not a calibration pass.
"""
from __future__ import annotations

import dataclasses
import math
import shutil
from pathlib import Path

from ..calibration import sensitivity
from ..calibration.dataset import select
from ..errors import UnsupportedError
from ..parity import gate
from ..parity.metrics import compare
from ..runtimes.ort import ort_cpu
from .policy import rhs_overrides, static_plan
from .qdq import int16_weights, quantize_qdq

RAISED_TYPE = "int16"
# SNR bars are searched with this margin: the smallest passing prefix sits at the bar by construction, and on the tiny
# preset the held-out parity prompts measured 0.37-0.43 dB below the calibration prompts (plain and mixed w8a16);
# 1 dB is more than twice that gap.
SELECTION_MARGIN_DB = 1.0
SENSITIVITY_SAMPLES = 64  # calibration samples the layers are ranked on (evenly spread over the set)


def _aims(thresholds, parts: int):
    """The bars a candidate is searched against: SNR + the selection margin, and with ``parts`` parts each part's
    share of the error (SNR + 10 log10(parts) dB, KLD / parts: independent errors add in power and in KLD)."""
    extra = 10 * math.log10(parts) if parts > 1 else 0.0
    out = []
    for t in thresholds:
        if t.metric == "snr_db" and t.min is not None:
            t = dataclasses.replace(t, min=t.min + SELECTION_MARGIN_DB + extra)
        elif t.metric.startswith("kld") and t.max is not None and parts > 1:
            t = dataclasses.replace(t, max=t.max / parts)
        out.append(t)
    return out


def _search(build, judge, order_of, work: Path, name: str, scheme_name: str) -> tuple[int, list[str], dict, dict | None]:
    """The smallest prefix of the sensitivity order whose candidate passes: ``build(k_dir, raised)`` writes a
    candidate, ``judge(path)`` gives its verdict, ``order_of(k0_path)`` the ranking (sensitivity, computed only
    when the plain build fails). Returns (k, order, trials, sensitivity)."""
    trials: dict[int, dict] = {}
    order: list[str] = []

    def trial(k: int) -> dict:
        if k not in trials:
            d = work / f"k{k}"
            d.mkdir()
            build(d, order[:k])
            verdict = judge(d)
            trials[k] = {"raised": k, "dir": d, "status": verdict["status"], "reasons": verdict["reasons"],
                         "figures": {c["output"] + " " + c["metric"]: c["value"] for c in verdict["checks"]}}
        return trials[k]

    if trial(0)["status"] == gate.PASS:
        return 0, order, trials, None
    sens, order[:] = order_of(trials[0]["dir"])
    lo, hi, k = 0, None, 1
    while hi is None:  # doubling until a prefix passes, or every weight is raised
        k = min(k, len(order))
        if trial(k)["status"] == gate.PASS:
            hi = k
        elif k == len(order):
            shutil.rmtree(work)
            raise UnsupportedError(
                f"scheme {scheme_name}: even with all {len(order)} weights of {name} at {RAISED_TYPE}, "
                f"{trials[k]['reasons'][0]} on the calibration prompts; no mixed-precision build passes")
        else:
            lo, k = k, 2 * k
    while hi - lo > 1:  # the smallest passing prefix
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if trial(mid)["status"] == gate.PASS else (mid, hi)
    return hi, order, trials, sens


def _info(order, chosen, trials, sens, thresholds, prompts, n_feeds, rhs, extra=None) -> dict:
    raised = order[:chosen]
    return {
        "overrides": {w: RAISED_TYPE for w in raised},
        "matmul_rhs_int16": rhs,
        "raised_layers": len(raised), "quantized_layers": len(order) if order else None,
        "selection": "smallest prefix of the sensitivity ranking (lowest isolated weight SNR first) that clears "
                     "the thresholds on the calibration set",
        "measured_on": f"calibration prompt set {prompts.name} ({len(prompts.prompts)} prompts) through the "
                       f"component's host loop; layers ranked on {n_feeds} calibration samples",
        "thresholds": [t.to_dict() for t in thresholds],
        "selection_margin_db": SELECTION_MARGIN_DB,
        "trials": [{k: v for k, v in t.items() if k != "dir"} for _, t in sorted(trials.items())],
        "sensitivity": sens, **(extra or {}),
    }


def _keep(best: Path, dst: Path) -> None:
    for f in best.iterdir():
        if f.name.startswith(dst.name):
            shutil.move(str(f), dst.parent / f.name)


def _judge(component, reference, aims, names):
    return lambda run: gate.judge(compare(reference, component.trace(run, reference, None), component.kind == "lm",
                                          first_step=component.parity_first_step), aims, names)


def quantize_mixed(src: Path, dst: Path, calibration, graph_feed, scheme, thresholds, graph, component,
                   trace_set) -> dict:
    """Write the chosen w8a16-mixed QDQ graph of a one-graph component to ``dst`` (plain w8a16 plus int16 weights,
    no component policy); return what was chosen and why (for ``Built.info``).

    ``trace_set``: (calibration PromptSet, {"max_prompt_tokens", "new_tokens"}) - each candidate is driven by the
    component's own host loop over these prompts and judged by the gate's own metrics and thresholds."""
    if len(component.graphs()) != 1:
        raise UnsupportedError(f"scheme {scheme.name}: quantize_mixed searches one-graph components ({component.name} "
                               f"has {len(component.graphs())} graphs: the qdq_onnx target searches it part by part)")
    if not thresholds:
        raise UnsupportedError(f"scheme {scheme.name}: no thresholds for {component.name}, so there is nothing for "
                               "the mixed-precision search to aim at")
    prompts, opts = trace_set
    reference = component.reference(prompts, opts)
    names = [s.name for s in graph.outputs]
    keep = select(calibration.samples, SENSITIVITY_SAMPLES)
    feeds = [graph_feed(f) for i, f in enumerate(calibration) if i in keep]
    work = dst.parent / f".mixed-{graph.name}"
    work.mkdir()
    cache = work / "ranges.json"
    plan = static_plan(src, None, scheme.activations)
    fixed = rhs_overrides(plan.rhs_int16, {}, None, scheme.activations, plan.rhs_converted) or None  # the HTP's MatMul rule, as in every uint16 build
    judge = _judge(component, reference, _aims(thresholds, 1), names)

    def build(d: Path, raised):
        quantize_qdq(src, d / dst.name, (graph_feed(f) for f in calibration), scheme, int16_weights(raised), cache,
                     fixed=fixed)

    def order_of(k0: Path):
        sens = sensitivity.analyze(src, k0 / dst.name, feeds, f"calibration set ({len(feeds)} samples)")
        return sens, sensitivity.ranking(sens)

    chosen, order, trials, sens = _search(build, lambda d: judge(ort_cpu(d / dst.name, names)), order_of, work,
                                          graph.name, scheme.name)
    _keep(trials[chosen]["dir"], dst)
    shutil.rmtree(work)
    return _info(order, chosen, trials, sens, thresholds, prompts, len(feeds), plan.rhs_int16)


def search_parts(parts, shared: dict, scheme, req, fp32) -> dict:
    """``qdq_onnx``'s mixed-precision pass over calibrated ``QdqPart``s (one per graph, ranges and shared encodings
    computed): per part, the smallest prefix of its sensitivity ranking raised to int16 that clears the aims with
    the other parts in fp32 (``fp32``: the ``onnx`` build, else the eager graphs); then every part's choice together
    against the thresholds themselves. Returns graph name -> what was chosen; each part's file is at its ``dst``."""
    comp, thresholds = req.component, req.thresholds
    if not thresholds:
        raise UnsupportedError(f"scheme {scheme.name}: no thresholds for {comp.name}, so there is nothing for the "
                               "mixed-precision search to aim at")
    prompts, opts = req.trace_set
    reference = comp.reference(prompts, opts)
    graphs = comp.graphs()
    names = [s.name for s in comp.output_specs()]
    base = {g.name: (ort_cpu(fp32.path(g.name), [s.name for s in g.outputs]) if fp32 is not None
                     else comp.eager_runner(g.module, [s.name for s in g.inputs])) for g in graphs}
    judge = _judge(comp, reference, _aims(thresholds, len(parts)), names)
    keep = select(req.calibration.samples, SENSITIVITY_SAMPLES)
    samples = [f for i, f in enumerate(req.calibration) if i in keep]  # read once, for every part's ranking
    out = {}
    for p in parts:
        g, dst = p.graph, p.dst
        work = dst.parent / f".mixed-{g.name}"
        work.mkdir()
        outs = [s.name for s in g.outputs]
        feeds = [comp.graph_feeds(f, g.name)[g.name] for f in samples]

        def order_of(k0: Path, p=p, feeds=feeds):
            sens = sensitivity.analyze(p.src, k0 / dst.name, feeds, f"calibration set ({len(feeds)} samples)")
            return sens, [w for w in sensitivity.ranking(sens) if w not in p.plan.int16]

        chosen, order, trials, sens = _search(
            lambda d, raised, p=p: p.candidate(d / p.dst.name, scheme, shared, raised),
            lambda d, g=g, outs=outs: judge(comp.chain({**base, g.name: ort_cpu(d / dst.name, outs)})),
            order_of, work, g.name, scheme.name)
        _keep(trials[chosen]["dir"], dst)
        shutil.rmtree(work)
        out[g.name] = _info(order, chosen, trials, sens, thresholds, prompts, len(feeds), p.plan.rhs_int16,
                            {"aims": [t.to_dict() for t in _aims(thresholds, len(parts))]} if len(parts) > 1 else None)
    for p in parts:
        shutil.rmtree(p.src.parent, ignore_errors=True)
    if len(parts) > 1:  # the parts' choices together, against the bars themselves (plus the selection margin)
        together = _judge(comp, reference, _aims(thresholds, 1), names)(
            comp.chain({p.graph.name: ort_cpu(p.dst, [s.name for s in p.graph.outputs]) for p in parts}))
        if together["status"] != gate.PASS:
            raise UnsupportedError(f"scheme {scheme.name}: {comp.name}'s parts, each chosen against its share of "
                                   f"the bars, miss them together: {together['reasons'][0]} on the calibration prompts")
        figures = {c["output"] + " " + c["metric"]: c["value"] for c in together["checks"]}
        for info in out.values():
            info["together"] = {"status": together["status"], "figures": figures}
    return out
