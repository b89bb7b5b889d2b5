"""The mixed-precision pass of the ``qdq_onnx`` target (``w8a16_mixed``): raise the most sensitive weights to int16
until the gate's thresholds hold.

Selection never sees the parity prompts: candidates are driven by the component's host loop over the calibration
prompts and judged with the gate's own metrics and thresholds. Layers are ranked by their isolated weight SNR on
calibration samples (``sensitivity``), and the smallest prefix of that ranking whose build clears every threshold
is kept (doubling, then bisection), with a margin on SNR bars.
The gate then judges the chosen build on the parity prompts like any other artifact. If even every weight at int16
misses a threshold on the calibration prompts, the export is refused.

int16 weights with 16-bit activations is a precision the HTP runs (W16A16); the activation ranges are computed once
and reused for every candidate, so a candidate costs one quantization pass, not a calibration pass.
"""
from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from ..calibration import sensitivity
from ..calibration.dataset import select
from ..errors import UnsupportedError
from ..parity import gate
from ..parity.metrics import compare
from ..runtimes.ort import ort_cpu
from .qdq_policy import rhs_overrides, static_plan
from .qdq_quantize import int16_weights, quantize_qdq

RAISED_TYPE = "int16"
# SNR bars are searched with this margin: the smallest passing prefix sits at the bar by construction, and on the tiny
# preset the held-out parity prompts measured 0.37-0.43 dB below the calibration prompts (plain and mixed w8a16);
# 1 dB is more than twice that gap.
SELECTION_MARGIN_DB = 1.0
SENSITIVITY_SAMPLES = 64  # calibration samples the layers are ranked on (evenly spread over the set)


def quantize_mixed(src: Path, dst: Path, calibration, graph_feed, scheme, thresholds, graph, component,
                   trace_set) -> dict:
    """Write the chosen w8a16-mixed QDQ graph to ``dst``; return what was chosen and why (for ``Built.info``).

    ``trace_set``: (calibration PromptSet, {"max_prompt_tokens", "new_tokens"}) - each candidate is driven by the
    component's own host loop over these prompts and judged by the gate's own metrics and thresholds."""
    if len(component.graphs()) != 1:
        raise UnsupportedError(f"scheme {scheme.name}: mixed precision is searched for one-graph components; "
                               f"{component.name} has {len(component.graphs())} graphs")
    if not thresholds:
        raise UnsupportedError(f"scheme {scheme.name}: no thresholds for {component.name}, so there is nothing for "
                               "the mixed-precision search to aim at")
    prompts, opts = trace_set
    aims = [dataclasses.replace(t, min=t.min + SELECTION_MARGIN_DB) if t.metric == "snr_db" and t.min is not None
            else t for t in thresholds]
    reference = component.reference(prompts, opts)
    names = [s.name for s in graph.outputs]
    keep = select(calibration.samples, SENSITIVITY_SAMPLES)
    feeds = [graph_feed(f) for i, f in enumerate(calibration) if i in keep]
    work = dst.parent / f".mixed-{graph.name}"
    work.mkdir()
    cache = work / "ranges.json"
    trials: dict[int, dict] = {}
    rhs = static_plan(src, None, scheme.activations)["rhs_int16"]
    fixed = rhs_overrides(rhs, {}, None, scheme.activations) or None  # the HTP's MatMul rule, as in every uint16 build

    def build(order: list[str], k: int) -> dict:
        if k in trials:
            return trials[k]
        d = work / f"k{k}"
        d.mkdir()
        quantize_qdq(src, d / dst.name, (graph_feed(f) for f in calibration), scheme, int16_weights(order[:k]), cache,
                     fixed=fixed)
        trace = component.trace(ort_cpu(d / dst.name, names), reference, None)
        verdict = gate.judge(compare(reference, trace, component.kind == "lm"), aims, names)
        trials[k] = {"raised": k, "dir": d, "status": verdict["status"], "reasons": verdict["reasons"],
                     "figures": {c["output"] + " " + c["metric"]: c["value"] for c in verdict["checks"]}}
        return trials[k]

    order: list[str] = []
    sens = None
    if build(order, 0)["status"] != gate.PASS:
        sens = sensitivity.analyze(src, trials[0]["dir"] / dst.name, feeds, f"calibration set ({len(feeds)} samples)")
        order = sensitivity.ranking(sens)
        lo, hi, k = 0, None, 1
        while hi is None:  # doubling until a prefix passes, or every weight is raised
            k = min(k, len(order))
            if build(order, k)["status"] == gate.PASS:
                hi = k
            elif k == len(order):
                shutil.rmtree(work)
                raise UnsupportedError(
                    f"scheme {scheme.name}: even with all {len(order)} weights of {graph.name} at {RAISED_TYPE}, "
                    f"{trials[k]['reasons'][0]} on the calibration prompts; no mixed-precision build passes")
            else:
                lo, k = k, 2 * k
        while hi - lo > 1:  # the smallest passing prefix
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if build(order, mid)["status"] == gate.PASS else (mid, hi)
        chosen = hi
    else:
        chosen = 0
    best = trials[chosen]["dir"]
    for f in best.iterdir():
        if f.name.startswith(dst.name):
            shutil.move(str(f), dst.parent / f.name)
    shutil.rmtree(work)
    raised = order[:chosen]
    return {
        "overrides": {w: RAISED_TYPE for w in raised},
        "matmul_rhs_int16": rhs,
        "raised_layers": len(raised), "quantized_layers": len(order) if order else None,
        "selection": "smallest prefix of the sensitivity ranking (lowest isolated weight SNR first) that clears "
                     "the thresholds on the calibration set",
        "measured_on": f"calibration prompt set {prompts.name} ({len(prompts.prompts)} prompts) through the "
                       f"component's host loop; layers ranked on {len(feeds)} calibration samples",
        "thresholds": [t.to_dict() for t in thresholds],
        "selection_margin_db": SELECTION_MARGIN_DB,
        "trials": [{k: v for k, v in t.items() if k != "dir"} for _, t in sorted(trials.items())],
        "sensitivity": sens,
    }
