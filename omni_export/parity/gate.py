"""The gate: thresholds + a parity report -> a verdict per check and per artifact. It fails closed: a threshold whose
metric was not measured, a figure that is not a finite number, or an artifact that no runtime here could execute,
never passes.

Every check carries ``status``: ``pass``, ``fail`` or ``skipped``. A skipped check (an LM threshold with
``min_positions`` measured on fewer positions) was recorded, not enforced: its ``ok`` is None (never True) and
``skipped`` says why; it neither blocks nor counts as passed."""
from __future__ import annotations

import fnmatch
import math
from dataclasses import asdict, dataclass

from ..errors import RecipeError

from .metric_specs import METRICS, metric

PASS, BLOCKED, UNVERIFIED = "pass", "blocked", "unverified"
FAIL, SKIPPED = "fail", "skipped"  # a check's status (beside PASS)
GENERATOR = "generator"  # a check's output: the logits of the artifact's own runtime's free run (``judge``)
# How an AI Hub inference job measures a component (``hub.payload``): ``teacher-forced``, an LM step fed the fp32
# run's caches, scored against the greedy tokens; ``per-call``, any component's recorded graph inputs, outputs
# compared call by call. What each cannot measure is the metric's own (``MetricSpec.unmeasurable_in``); those
# thresholds stay enforced by the local verdict.
DEVICE_MODE_NAMES = ("teacher-forced", "per-call")


def unmeasured_in(mode: str) -> dict[str, str]:
    """{metric: why} for every registered metric the on-device ``mode`` cannot measure."""
    if mode not in DEVICE_MODE_NAMES:
        raise KeyError(mode)
    return {n: why for n, s in METRICS.items() if (why := s.unmeasurable_in(mode)) is not None}


@dataclass(frozen=True)
class Threshold:
    metric: str
    outputs: str = "*"          # glob over output names (ignored for LM metrics)
    min: float | None = None
    max: float | None = None
    reason: str = ""
    # LM metrics only: judged where at least this many positions were measured; on fewer (an HTP-simulator run of
    # 8-16 steps) the check is recorded, not enforced: one token there moves top-1 by 0.06-0.12 (docs/parity.md)
    min_positions: int | None = None

    def __post_init__(self):
        spec = metric(self.metric)  # a one-line error naming the known metrics
        if (self.min is None) == (self.max is None):
            raise RecipeError(f"threshold {self.metric} on {self.outputs!r} needs exactly one of min or max")
        if self.min_positions is not None and spec.kind != "lm":
            raise RecipeError(f"threshold {self.metric}: min_positions applies to LM metrics only")
        if not self.reason.strip():
            raise RecipeError(f"threshold {self.metric} on {self.outputs!r} has no reason: every threshold says why")
        for k in ("min", "max"):
            v = getattr(self, k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
                raise RecipeError(f"threshold {self.metric} on {self.outputs!r}: {k} {v!r} is not a finite number")
        if self.min_positions is not None and (isinstance(self.min_positions, bool)
                                               or not isinstance(self.min_positions, int) or self.min_positions < 1):
            raise RecipeError(f"threshold {self.metric}: min_positions {self.min_positions!r} is not a positive integer")

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def ok(self, value: float) -> bool:
        return value >= self.min if self.min is not None else value <= self.max

    @property
    def bound(self) -> str:
        return f">= {self.min:g}" if self.min is not None else f"<= {self.max:g}"


def figure_problem(value) -> str | None:
    """Why ``value`` cannot be judged as a figure (None when it is a finite number; a missing figure is None too)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"is {type(value).__name__} {str(value)[:40]!r}, not a number"
    if not math.isfinite(value):
        return f"is {value!r}, not a finite number"
    return None


def judge(report: dict, thresholds: list[Threshold], output_names: list[str], hidden: str | None = None) -> dict:
    """Return {"status", "reasons", "checks"} for one parity report; each check's ``status`` is pass, fail or
    skipped (recorded, not enforced: ``ok`` None, never True). ``hidden``: why the artifact exposes only the
    outputs its report measured (a program that keeps its caches inside): an output threshold is then judged on
    those, and one matching none of them is a skipped check carrying that reason.

    A bundle whose own runtime generated the free run (``report["generator"]``: Genie, onnxruntime-genai) and
    handed out its logits is also judged on them: every ``snr_db`` threshold on ``logits`` applies to the logits that
    runtime computed at its generated positions while its ids followed fp32's (output ``generator``). The
    teacher-forced figures feed fp32's caches; only the runtime's own run shows what its cache holds (a quantized
    attention sink the teacher-forced steps never computed)."""
    checks, reasons = [], []
    gen = report.get("generator") or {}
    if not thresholds:
        return {"status": BLOCKED, "reasons": ["no thresholds declared for this scheme"], "checks": []}
    for th in thresholds:
        spec = metric(th.metric)
        if spec.kind == "lm":
            lm = report.get("lm") or {}
            n = lm.get(spec.positions or "")
            value = lm.get(th.metric)
            # too few positions to judge: a figure over fewer than ``min_positions``, or none because the executed
            # steps held no position of its kind (a window of steps inside a long prompt has no generated position)
            measured = value is not None and figure_problem(value) is None and figure_problem(n) is None
            if th.min_positions is not None and (measured or (value is None and n == 0 and type(n) is int)) \
                    and (n or 0) < th.min_positions:
                checks.append({"output": "lm", "metric": th.metric, "value": value, "bound": th.bound,
                               "status": SKIPPED, "ok": None, "reason": th.reason,
                               "skipped": f"{n} positions < {th.min_positions}: too few to judge, not enforced"})
                continue
            targets = [("lm", value)]
        elif spec.kind == "audio":
            targets = [("audio", (report.get("audio") or {}).get(th.metric))]
        else:
            names = [n for n in output_names if fnmatch.fnmatchcase(n, th.outputs)]
            if not names:
                raise RecipeError(f"threshold on outputs {th.outputs!r} matches no output of the component")
            if hidden is not None:  # the outputs the artifact does not expose: one skipped check naming them
                unseen = [n for n in names if n not in (report.get("outputs") or {})]
                if unseen:
                    checks.append({"output": ", ".join(unseen), "metric": th.metric, "value": None,
                                   "bound": th.bound, "status": SKIPPED, "ok": None, "reason": th.reason,
                                   "skipped": hidden})
                names = [n for n in names if n not in unseen]
            targets = [(n, ((report.get("outputs") or {}).get(n) or {}).get(th.metric)) for n in names]
            if gen.get("positions") and th.metric == "snr_db" and "logits" in names:
                targets.append((GENERATOR, gen.get("logits_snr_db")))  # the logits the own runtime generated with
        for name, value in targets:
            bad = figure_problem(value)
            ok = value is not None and bad is None and th.ok(value)
            checks.append({"output": name, "metric": th.metric, "value": value, "bound": th.bound,
                           "status": PASS if ok else FAIL, "ok": ok, "reason": th.reason})
            if value is None:
                reasons.append(f"{name} {th.metric} was not measured (required {th.bound})")
            elif bad is not None:
                reasons.append(f"{name} {th.metric} {bad} (required {th.bound})")
            elif not ok:
                reasons.append(f"{name} {th.metric} = {value:.4g}, required {th.bound}")
    refused = gen.get("refused")
    if refused:  # the target's own runtime (Genie) refused the artifact: figures from another runtime cannot pass it
        reasons.append(f"the artifact's own runtime refused it: {refused}")
    return {"status": PASS if not reasons else BLOCKED, "reasons": reasons, "checks": checks}


def check_status(check: dict) -> str:
    """pass, fail or skipped for a verdict's check (one written without ``status``: from ``ok``, and a check
    carrying ``not_enforced``/``skipped`` is skipped whatever its ``ok`` says)."""
    if check.get("skipped") or check.get("not_enforced"):
        return SKIPPED
    st = check.get("status")
    if st in (PASS, FAIL, SKIPPED):
        return st
    return PASS if check.get("ok") is True else FAIL


def unverified(reason: str) -> dict:
    return {"status": UNVERIFIED, "reasons": [reason], "checks": []}


def off_target(local: dict, note: str) -> dict:
    """The verdict for figures measured by executing the shipping file on a local stand-in runtime, not the target's:
    a local failure blocks the artifact (the file itself is unfaithful); a local pass is only ``unverified`` on target
    until a run on the target verifies it. The local checks stay in the verdict."""
    if local["status"] != PASS:
        return {**local, "reasons": [f"{r} (measured locally: {note})" for r in local["reasons"]]}
    return {"status": UNVERIFIED, "reasons": [f"unverified on target: {note}; local parity passed"],
            "checks": local["checks"], "local_status": PASS}


def asked_steps(comp, reference, budget: int | None) -> int:
    """The steps a trace within ``budget`` measures when every graph call it asks for runs (what ``compare``
    reports as ``steps``): the component's own host loop, driven by a runner that answers every call with zeros of
    the output shapes, so no model or runtime runs. A trace that measured fewer steps stopped short."""
    import numpy as np

    from .metrics import compared_steps

    zeros = [np.zeros(s.shape, np.dtype(s.dtype)) for s in comp.output_specs()]
    trace = comp.trace(lambda feed: [z.copy() for z in zeros], reference, budget)
    return compared_steps(trace, comp.parity_first_step)


def expectation(recipe, results, code: int, say) -> int:
    """The run's exit code once the recipe's expectation is enforced: a recipe with ``expect_blocked`` whose artifact
    passes exits ``EXIT_EXPECTATION`` (the known-broken scheme stopped being caught, or got fixed: either way a person
    must look); a recipe that expects its artifacts to pass says which were blocked (exit ``EXIT_BLOCKED``)."""
    from ..errors import EXIT_EXPECTATION

    if recipe.expect_blocked:
        passed = [a.artifact_id for a in results if a.status == PASS]
        if passed:
            say(f"[red]expectation failed[/]: recipe {recipe.name} expects every artifact blocked (expect_blocked: "
                f"true) and {', '.join(passed)} passed")
            return EXIT_EXPECTATION
        return code
    blocked = [a.artifact_id for a in results if a.status == BLOCKED]
    if blocked:
        say(f"recipe {recipe.name} expects its artifacts to pass; blocked: {', '.join(blocked)}")
    return code
