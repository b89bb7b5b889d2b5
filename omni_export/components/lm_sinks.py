"""Attention-sink positions of a decoder LM's fp32 run, excluded from the decode step's calibration.

Trained decoders park attention on a few "sink" tokens: position 0, and tokens like SmolLM2's ``<|endoftext|>``
(id 0) wherever they occur, whose residual stream reaches ~15-26k while every other position stays under ~1k
(docs/parity.md, "Trained weights: the attention sink"). A 16-bit range that covers them leaves few bits for every
ordinary position, so the decode step is calibrated without them; in deployment the prefill writes their cache
rows (``decoder_lm.SINK_NOTE``).

The rule: run the calibration prompts through the fp32 decode loop, take each position's residual-stream absmax
(the largest |x| any layer outputs at that position); position 0 and every position above ``SINK_RATIO`` x the
median position's absmax are sinks.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

SINK_RATIO = 8.0  # faithful positions of SmolLM2 stay < ~1k, sinks reach 15-26k (docs/parity.md): 8x the median


@dataclass
class SinkPlan:
    excluded: list[set[int]]                  # per calibration sequence: positions left out (0 always)
    steps: list[int]                          # per sequence: graph calls of the fp32 loop
    token_ids: dict[int, int] = field(default_factory=dict)  # token id -> times excluded beyond position 0
    median_absmax: float = 0.0
    threshold: float = 0.0

    def kept(self, b: int) -> list[int]:
        return [p for p in range(self.steps[b]) if p not in self.excluded[b]]

    @property
    def total(self) -> int:
        return sum(len(self.kept(b)) for b in range(len(self.steps)))

    def note(self) -> dict:
        """What the calibration set's metadata records."""
        if self.threshold == float("inf"):
            return {"rule": "none: the scheme calibrates on every position, attention sinks included"}
        return {"rule": f"position 0 and positions whose residual-stream absmax exceeds {SINK_RATIO:g} x the median "
                        "position's (fp32 run); their cache rows come from the prefill in deployment",
                "median_absmax": round(self.median_absmax, 3), "threshold": round(self.threshold, 3),
                "excluded_positions": sum(len(e) for e in self.excluded),
                "excluded_beyond_position_0": sum(len(e) - 1 for e in self.excluded),
                "excluded_token_ids": {str(k): v for k, v in sorted(self.token_ids.items())},
                "kept_positions": self.total}


def sink_plan(comp, ids: list[list[int]], n_new: list[int], keep_sinks: bool = False, on_step=None) -> SinkPlan:
    """Measure every calibration position's residual absmax in one batched fp32 pass (``comp.batched_steps``; the LM
    head only where a row chooses its next token: ``head_rows_runner``),
    calling ``on_step(pos, active, feed, outputs)`` at every step of it (``lm_capture.CaptureRecord``).
    ``keep_sinks`` (a scheme's ``calibrate_sinks``, the naive build): exclude nothing, measure nothing."""
    if keep_sinks:
        steps = [min(comp.context, len(t) + max(0, n - 1)) for t, n in zip(ids, n_new)]
        return SinkPlan([set() for _ in ids], steps, threshold=float("inf"))
    layers = comp.bundle.module.model.layers
    absmax: list[dict[int, float]] = [{} for _ in ids]
    cur: dict = {}

    def hook(_mod, _inp, out):
        x = out[0] if isinstance(out, (tuple, list)) else out
        m = x.detach().abs().reshape(x.shape[0], -1).amax(dim=1).numpy()
        cur["m"] = m if "m" not in cur else np.maximum(cur["m"], m)

    handles = [layer.register_forward_hook(hook) for layer in layers]
    gens: list[list[int]] = [[] for _ in ids]
    try:
        for pos, active, f, o, gens in comp.batched_steps(comp.head_rows_runner(), ids, n_new):
            if on_step is not None:
                on_step(pos, active, f, o)
            m = cur.pop("m")
            for b in active:
                absmax[b][pos] = float(m[b])
    finally:
        for h in handles:
            h.remove()
    steps = [len(a) for a in absmax]
    values = np.array([v for a in absmax for p, v in a.items() if p > 0] or [0.0])
    med = float(np.median(values))
    thr = SINK_RATIO * med
    excluded = [{0} | {p for p, v in a.items() if p > 0 and v > thr} for a in absmax]
    plan = SinkPlan(excluded, steps, median_absmax=med, threshold=thr)
    fed = [list(t) + list(g) for t, g in zip(ids, gens)]  # what each row was fed: the prompt, then its greedy tokens
    for b, ex in enumerate(excluded):
        for p in ex - {0}:
            tok = fed[b][p]
            plan.token_ids[tok] = plan.token_ids.get(tok, 0) + 1
    return plan

