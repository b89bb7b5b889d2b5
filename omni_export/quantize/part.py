"""One graph's QDQ build under its component's policy (``Component.qdq_policy``), as the ``qdq_onnx`` target and
the Genie bundles (``genie_qdq``) run it: calibrated first when the policy decides from ranges or graphs share
encodings, then quantized in a ``PartPool`` worker; ``record`` is what the manifest says it got."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..schemes import QdqPolicy
from .minmax_pass import batch_note
from .policy import Plan, load_ranges, outlier_convs, rhs_overrides
from .qdq import calibrate_part, clip_bounds, int16_weights, quantize_part, quantize_qdq, widen_ranges


class QdqPart:
    """One graph's QDQ build under its component's policy: calibrated first when the policy decides from ranges or
    parts share encodings, then quantized (in a ``PartPool`` worker)."""

    def __init__(self, graph, src: Path, dst: Path, policy: QdqPolicy | None, plan: Plan):
        self.graph, self.src, self.dst, self.policy, self.plan = graph, src, dst, policy, plan
        self.cache, self.margin, self.outliers = None, policy.range_margin if policy else 1.0, None
        self.searched = None  # searched per-channel weight scales (policy ``weight_scales: mse``, ``scale_search``)
        self.pass_note = None  # how its calibration pass ran (``minmax_pass.batch_note``)

    def needs_ranges(self) -> bool:
        return bool(self.plan.rhs_int16 or (self.policy and self.policy.needs_ranges))

    def io_names(self) -> set[str]:
        return {s.name for s in (*self.graph.inputs, *self.graph.outputs)}

    def rhs_io(self) -> list[list[str]]:
        """The graph-IO tensors of each int16-symmetric MatMul group (``matmul_rhs_groups``): shared across graphs."""
        io = self.io_names()
        return [[t for t in g if t in io] for g in self.plan.rhs_int16 if io & set(g)]

    def calibrate(self, feeds, scheme, memo=None, batched=None, outputs=None) -> None:
        self.cache = self.src.parent / "ranges.json"
        search = bool(self.policy and self.policy.weight_scales == "mse" and scheme.weights == "int8"
                      and scheme.per_channel)
        if batched is not None:
            (self.src.parent / "batched").mkdir(exist_ok=True)
        try:
            self.searched = calibrate_part(self.src, feeds, scheme, self.cache, search, self.plan.int16, memo,
                                           batched, outputs)
        finally:
            shutil.rmtree(self.src.parent / "batched", ignore_errors=True)
        note = batch_note(self.cache)
        self.pass_note = json.loads(note.read_text()) if note.is_file() else None
        if self.margin != 1.0:
            widen_ranges(self.cache, self.margin, clip_bounds(self.src))
            self.margin = 1.0
        if self.policy and self.policy.float_outliers:
            nodes, self.outliers = outlier_convs(self.src, load_ranges(self.cache), self.policy.float_outliers)
            self.plan.float_nodes += nodes

    def overrides(self, scheme, shared: dict, raised=()) -> tuple[dict | None, dict | None]:
        """(ORT tensor overrides, overrides applied after its mixed-precision fixer) for this part's quantization:
        the policy's int16 weights plus ``raised`` (mixed precision), searched scales for the other int8 weights,
        the encodings shared with other parts, and the MatMul rule."""
        names = self.io_names()
        overrides = dict(int16_weights([*self.plan.int16, *raised]) or {})
        overrides.update({w: v for w, v in (self.searched or {}).get("overrides", {}).items() if w not in raised})
        overrides.update({t: v for t, v in shared.items() if t in names})
        fixed = rhs_overrides(self.plan.rhs_int16, overrides, load_ranges(self.cache) if self.cache else None,
                              scheme.activations, self.plan.rhs_converted)
        overrides = {t: v for t, v in overrides.items() if t not in fixed}
        return overrides or None, fixed or None

    def submit(self, pool, feeds, scheme, shared: dict) -> None:
        overrides, fixed = self.overrides(scheme, shared)
        pool.submit(quantize_part, self.src, self.dst, feeds, scheme, overrides, self.margin, self.cache,
                    tuple(self.plan.float_nodes), fixed)

    def candidate(self, dst: Path, scheme, shared: dict, raised) -> None:
        """This part quantized into ``dst`` with the ``raised`` weights at int16 too (a mixed-precision candidate;
        ranges from ``calibrate``, so no calibration pass)."""
        overrides, fixed = self.overrides(scheme, shared, raised)
        quantize_qdq(self.src, dst, iter(()), scheme, overrides, self.cache, self.margin,
                     tuple(self.plan.float_nodes), fixed)

    def record(self) -> dict:
        rec = self.policy.to_record() if self.policy else {}
        if self.plan.int16:
            rec["int16_weights"] = list(self.plan.int16)
        if self.plan.float_nodes:
            rec["float_nodes"] = list(self.plan.float_nodes)
        if self.outliers is not None:
            rec["float_outliers"] = self.outliers
        if self.pass_note is not None:
            rec["calibration_pass"] = self.pass_note
        if self.searched is not None:
            per = self.searched["record"]
            rec["weight_scale_search"] = {
                "rule": "per output channel, the scale (1.0 to 0.5 x min-max) with the least output error "
                        "(w - q) G (w - q)^T on the calibration set's projection inputs (G = X^T X)",
                "weights": len(per), "clipped_channels": sum(v["clipped_channels"] for v in per.values()),
                "channels": sum(v["channels"] for v in per.values()), "per_weight": per}
        return rec
