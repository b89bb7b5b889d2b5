"""The CI gate: re-judge every artifact in a store from first principles and fail when any is not what it should be.

For every directory on a shelf (``published``, ``blocked``, ``unverified``) it checks, as separate cases:

- ``manifest``: the directory has a valid manifest (a directory without one fails, naming it);
- ``files``: the file set is exactly the manifest's (none missing, none extra), each with its sha256 and size;
- ``recipe``: the manifest pins (``recipe.hash``) a recipe that can be found (a run report of the store, or the
  shipped recipe), its thresholds are that recipe's thresholds for the component and scheme, byte for byte, and the
  pinned recipe is the one CI trusts under that name (``audit.trust``: the shipped recipe, or a file named with
  ``--trust``), so a recipe minted inside the store fails;
- ``steps``: the steps measured equal the steps asked (``parity.asked_steps``) and the baseline's steps; a bounded
  runtime's budget equals the pinned recipe's ``simulator_steps``;
- ``figures``: every figure the verdict's checks quote equals the figure in ``parity.metrics``, and both, with the
  artifact's file hashes, equal what the run report of the pinned recipe recorded for the artifact;
- ``verdict``: the verdict **recomputed** from the figures and the pinned thresholds (the stored status is ignored;
  an off-target pass stays unverified), with AI Hub sections judged the same way; a blocked artifact fails, an
  unverified one fails unless ``allow_unverified`` (then skipped, never passed), and the shelf must be the one the
  recomputed verdict belongs on;
- ``expectation``: an artifact of a recipe with ``expect_blocked`` that passes fails with its own exit code;
- one case per threshold check, also against the committed baseline (beyond its tolerance fails, threshold or not).

A check recorded but not enforced is a skipped case, never a pass; a manifest that cannot be judged (a string figure,
JSON nested too deeply) is one failing ``manifest`` case; only regular files are read (``audit.shelf_files``).
Re-executing is separate: ``gate --reexecute`` runs the shelved files again (``commands.reexecute``), ``--rerun``
rebuilds into a fresh store that the gate then audits (``commands.ci``); nothing here writes to the store.
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path

from ..artifacts.store import SHELF_OF  # the one verdict -> shelf map
from ..errors import EXIT_BLOCKED, EXIT_EXPECTATION, EXIT_OK, OmniError
from ..parity.gate import (BLOCKED, DEVICE_MODE_NAMES, GENERATOR, PASS, SKIPPED, UNVERIFIED, check_status, judge,
                           metric, unmeasured_in)
from .gate_store import Entry, Runs, baseline_from, read_baseline, scan, verify_files  # noqa: F401 (re-exported)
from .trust import Trust, overrides_of as _trusted_overrides

RESULT_SCHEMA = "omni-export/gate/2"
ORDER = (PASS, UNVERIFIED, BLOCKED)  # worst last


@dataclass(frozen=True)
class Tolerances:
    """How far a figure may fall behind its baseline before the gate fails, whatever the threshold says.

    Each metric names its field (``MetricSpec.tolerance``): ``db``, absolute dB (SNR); ``agreement``, absolute
    fraction; ``ratio``, lower-is-better errors fail above ``ratio`` x the baseline. The runtimes are deterministic,
    so any move means the artifact, the reference or the runtime changed; the tolerances only leave room for a
    legitimate rebuild and are declared on the command line of the CI job, in the open."""
    db: float = 1.0
    agreement: float = 0.02
    ratio: float = 2.0

    def limit(self, name: str, base: float) -> tuple[float, str]:
        """(the worst value accepted, how): the metric's registered tolerance and direction."""
        spec = metric(name)
        if spec.tolerance == "db":
            return base - self.db, f"baseline {base:.4g} - {self.db:g} dB"
        if spec.tolerance == "ratio":
            return base * self.ratio, f"baseline {base:.4g} x {self.ratio:g}"
        return base - self.agreement, f"baseline {base:.4g} - {self.agreement:g}"

    def regressed(self, name: str, value: float, base: float) -> bool:
        lim, _ = self.limit(name, base)
        return value > lim if metric(name).lower_is_better else value < lim

    def to_dict(self) -> dict:
        return {"snr_db": self.db, "agreement": self.agreement, "error_ratio": self.ratio}


@dataclass
class Case:
    """One JUnit test case: ``status`` is pass, fail or skipped; ``message`` says why in one line."""
    name: str
    status: str
    message: str = ""
    value: float | None = None
    bound: str | None = None
    baseline: float | None = None


def _case(name: str, problems: list[str], ok: str) -> Case:  # fails with every problem, else passes saying ``ok``
    return Case(name, "fail" if problems else "pass", "; ".join(problems) if problems else ok)


@dataclass
class ArtifactCheck:
    recipe: str
    artifact_id: str
    shelf: str
    location: str
    verdict: str                 # recomputed (never the stored one)
    runtime: str | None
    steps: int | None
    cases: list[Case] = field(default_factory=list)
    figures: dict[str, float | None] = field(default_factory=dict)   # "output/metric" -> value, for the baseline
    files: dict[str, str] = field(default_factory=dict)

    key = property(lambda self: f"{self.recipe}/{self.artifact_id}")

    @property
    def outcome(self) -> str:
        states = {c.status for c in self.cases}
        return "fail" if "fail" in states else ("skipped" if "skipped" in states else "pass")

    def to_dict(self) -> dict:
        return {"recipe": self.recipe, "id": self.artifact_id, "shelf": self.shelf, "location": self.location,
                "verdict": self.verdict, "runtime": self.runtime, "steps": self.steps,
                "outcome": self.outcome, "cases": [c.__dict__ for c in self.cases]}


@dataclass
class GateResult:
    store: str
    artifacts: list[ArtifactCheck]
    missing: list[Case]                      # baseline entries with no artifact in the store
    tolerances: Tolerances
    baseline: str | None
    allow_unverified: bool
    extra: dict = field(default_factory=dict)   # e.g. the rerun's moved figures

    @property
    def failures(self) -> list[tuple[str, Case]]:
        out = [(a.key, c) for a in self.artifacts for c in a.cases if c.status == "fail"]
        return out + [(c.name, c) for c in self.missing]

    @property
    def exit_code(self) -> int:
        fails = self.failures
        return EXIT_EXPECTATION if any(c.name == "expectation" for _, c in fails) else EXIT_BLOCKED if fails else EXIT_OK

    def to_dict(self) -> dict:
        return {"schema": RESULT_SCHEMA, "store": self.store, "ok": not self.failures, "exit_code": self.exit_code,
                "baseline": self.baseline, "tolerances": self.tolerances.to_dict(),
                "allow_unverified": self.allow_unverified, **self.extra,
                "counts": counts(self), "artifacts": [a.to_dict() for a in self.artifacts],
                "missing_from_store": [c.__dict__ for c in self.missing],
                "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


def counts(res: GateResult) -> dict:
    cases = [c for a in res.artifacts for c in a.cases] + res.missing
    return {"artifacts": len(res.artifacts), "cases": len(cases),
            "failed": sum(c.status == "fail" for c in cases), "skipped": sum(c.status == "skipped" for c in cases)}


# -- the checks of one artifact ---------------------------------------------------------------------------------
def _output_names(m: dict) -> list[str]:
    recorded = m["artifact"].get("component") or {}
    return [o[0] for o in recorded.get("outputs") or []] or list(((m["parity"].get("metrics") or {}).get("outputs") or {}))


def _figure_path(output: str, metric: str) -> tuple:  # GENERATOR: the own runtime's logits (``parity.gate.judge``)
    return ((output, metric) if output in ("lm", "audio") else (GENERATOR, f"logits_{metric}")
            if output == GENERATOR else ("outputs", output, metric))


def _figure(metrics: dict, output: str, metric: str):
    for k in _figure_path(output, metric):
        metrics = metrics.get(k) if isinstance(metrics, dict) else None
    return metrics


def _figure_key(output: str, metric: str) -> str:
    return "parity.metrics." + ".".join(_figure_path(output, metric))


def _cross_check(verdict: dict | None, metrics: dict | None, where: str) -> list[str]:
    """Every figure a stored verdict quotes must be the measured figure (an edited figure shows here)."""
    out = []
    for c in (verdict or {}).get("checks") or []:
        if c.get("where") or metrics is None:
            continue
        got = _figure(metrics, c.get("output"), c.get("metric"))
        if got != c.get("value"):
            out.append(f"{where}{_figure_key(c.get('output'), c.get('metric'))} = {got!r} but the verdict's check "
                       f"records {c.get('value')!r}")
    return out


def _plain(thresholds) -> list:
    """Thresholds as comparable values: unset bounds dropped, numbers as floats (45 == 45.0), nothing else eased."""
    if not isinstance(thresholds, list):
        return [thresholds]
    return [{k: (float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
             for k, v in t.items() if v is not None} if isinstance(t, dict) else t for t in thresholds]


def _pinned_thresholds(m: dict, pinned) -> tuple[list, list[str]]:
    comp, scheme = (m["artifact"].get("component") or {}).get("name"), (m.get("scheme") or {}).get("name")
    th = list(pinned.thresholds_for(comp, scheme))
    problems = []
    if not th:
        problems.append(f"the pinned recipe has no thresholds for {comp}/{scheme}: nothing can pass")
    key = f"{comp}/{scheme}" if f"{comp}/{scheme}" in pinned.thresholds else scheme
    if m.get("thresholds_key") != key:
        problems.append(f"thresholds_key {m.get('thresholds_key')!r} is not the pinned recipe's {key!r}")
    if _plain(m["thresholds"]) != _plain([t.to_dict() for t in th]):
        problems.append(f"thresholds differ from the pinned recipe's for {comp}/{scheme} "
                        f"(manifest {len(m['thresholds'])}, recipe {len(th)} entries)")
    return th, problems


def _hub_status(m: dict, th: list, outputs: list[str], cases: list[Case]) -> list[str]:
    """Recompute every AI Hub device verdict; one case per device; returns their statuses."""
    statuses = []
    for dev, h in sorted((m.get("hub") or {}).items()):
        name, problems = f"ai-hub {dev}", []
        failure = (h.get("compile") or {}).get("failure")
        metrics, mode = (h.get("parity") or {}).get("metrics"), (h.get("parity") or {}).get("mode_key")
        if not failure and metrics is not None and mode not in DEVICE_MODE_NAMES:
            statuses.append(BLOCKED)
            cases.append(Case(name, "fail", f"hub.{dev}.parity.mode_key {mode!r} is not one of {sorted(DEVICE_MODE_NAMES)}"))
            continue
        measured = [t for t in th if t.metric not in (unmeasured_in(mode) if mode in DEVICE_MODE_NAMES else {})]
        if failure or metrics is None:
            statuses.append(BLOCKED)
            cases.append(Case(name, "fail", f"no on-device figures: {failure or 'hub.parity.metrics is missing'}"))
            continue
        if _plain(h.get("thresholds")) != _plain([t.to_dict() for t in measured]):
            problems.append(f"hub.{dev}.thresholds differ from the pinned recipe's")
        problems += _cross_check(h.get("verdict"), metrics, f"hub.{dev}.")
        v = judge(metrics, measured, outputs)
        statuses.append(v["status"])
        problems += [f"on device: {r}" for r in v["reasons"]]
        cases.append(_case(name, problems, f"{len(v['checks'])} on-device checks pass"))
    return statuses


def _threshold_cases(v: dict, base: dict | None, tol: Tolerances) -> tuple[list[Case], dict]:
    """One case per check of the recomputed verdict: its threshold (a check recorded but not enforced is skipped,
    never passed) and, with a baseline entry for the artifact, its baseline figure (which must exist)."""
    cases, figures = [], {}
    base_figs = (base or {}).get("figures") or {}
    for chk in v["checks"]:
        name, value, fkey = f"{chk['output']} {chk['metric']}", chk["value"], f"{chk['output']}/{chk['metric']}"
        figures[fkey] = value
        status, msgs = check_status(chk), []
        if value is None:
            msgs.append(f"not measured (required {chk['bound']})")
        elif status == "fail":
            msgs.append(f"{value!r} misses the threshold {chk['bound']}" if not isinstance(value, (int, float))
                        else f"{value:.4g} misses the threshold {chk['bound']}")
        b = base_figs.get(fkey)
        if base is not None and fkey not in base_figs:
            msgs.append(f"the baseline entry has no figure {fkey}: rewrite the baseline (--write-baseline)")
        elif base is not None and b is None and value is not None:
            msgs.append(f"the baseline records {fkey} as not measured, now it is {value:.4g}: rewrite the baseline")
        if isinstance(value, (int, float)) and b is not None and tol.regressed(chk["metric"], value, b):
            lim, how = tol.limit(chk["metric"], b)
            op = "<=" if metric(chk["metric"]).lower_is_better else ">="
            msgs.append(f"{value:.4g} regressed beyond the baseline: accepted {op} {lim:.4g} ({how})"
                        + (" although the threshold is met" if status == PASS else ""))
        if msgs:
            cases.append(Case(name, "fail", "; ".join(msgs), value, chk["bound"], b))
            continue
        base_note = f", baseline {b:.4g}" if b is not None else ", no baseline"
        if status == SKIPPED:
            why = chk.get("skipped") or chk.get("not_enforced") or "recorded, not enforced"
            cases.append(Case(name, "skipped", f"not enforced: {why} ({value:.4g}, bound {chk['bound']}{base_note})",
                              value, chk["bound"], b))
        else:
            cases.append(Case(name, "pass", f"{value:.4g} {chk['bound']}{base_note}", value, chk["bound"], b))
    return cases, figures


def _steps_case(m: dict, pinned, base: dict | None) -> Case:
    p, problems = m["parity"], []
    measured = (p.get("metrics") or {}).get("steps")
    if p.get("metrics") is not None:
        asked = p.get("asked_steps")
        if not isinstance(asked, int):
            problems.append("parity.asked_steps is missing: the steps asked cannot be compared with the steps measured")
        elif measured != asked:
            problems.append(f"parity.metrics.steps {measured} measured, {asked} asked (parity.asked_steps)")
    if pinned is not None and p.get("bounded_steps") is not None and p["bounded_steps"] != pinned.parity.simulator_steps:
        problems.append(f"parity.bounded_steps {p['bounded_steps']} != the pinned recipe's simulator_steps "
                        f"{pinned.parity.simulator_steps}")
    if base is not None and base.get("steps") is not None and measured != base["steps"]:
        problems.append(f"parity.metrics.steps {measured} != the baseline's {base['steps']} steps")
    return _case("steps", problems, f"{measured} step(s) measured as asked")


def _verdict_case(shelf: str, status: str, reasons: list[str], stored: str | None, allow_unverified: bool) -> Case:
    summary = f"{len(reasons)} reason(s), first: {reasons[0]}" if len(reasons) > 1 else "; ".join(reasons)
    note = f" (the stored verdict says {stored!r})" if stored != status else ""
    if SHELF_OF[status] != shelf:
        return Case("verdict", "fail", f"recomputed verdict {status!r}{note} but the artifact is on the {shelf} shelf"
                    + (f": {summary}" if summary else ""))
    if status == BLOCKED:
        when = "blocked when it was built, and again" if stored == BLOCKED else "blocked"
        return Case("verdict", "fail", f"{when} by its figures against the pinned recipe: {summary}{note}")
    if status == UNVERIFIED:
        if allow_unverified:
            return Case("verdict", "skipped", f"unverified (allowed by --allow-unverified, not a pass): {summary}")
        return Case("verdict", "fail", f"unverified, no runtime here executed it on its target: {summary}")
    return Case("verdict", "pass", "pass (recomputed from the figures and the pinned recipe)")


def check_entry(e: Entry, runs: Runs, base: dict | None, tol: Tolerances, allow_unverified: bool,
                trust: Trust | None = None) -> ArtifactCheck:
    if e.manifest is None:
        return ArtifactCheck(e.recipe, e.dir.name, e.shelf, e.where, BLOCKED, None, None,
                             [Case("manifest", "fail", e.problem or "no manifest")])
    m = e.manifest
    aid, metrics, pin = m["artifact"]["id"], m["parity"].get("metrics"), m["recipe"]["hash"]
    bad = verify_files(e.dir, m)
    cases = [_case("files", bad, f"{len(m['artifact']['files'])} file(s), exactly the manifest's, match their sha256")]
    pinned, where = runs.pinned(e.recipe, pin)
    th, rproblems = _pinned_thresholds(m, pinned) if pinned is not None else ([], [f"recipe.hash: {where}"])
    trust = trust or Trust.named(None)
    untrusted, trusted_as = trust.check(e.recipe, pinned)
    rproblems += [untrusted] if untrusted else []
    known = e.recipe in trust.recipes
    cases.append(_case("recipe", rproblems, f"pinned recipe {pin[:12]}… ({where}); thresholds match"
                       + (f"; it is {trusted_as}" if known else "")))
    cases += [Case("trust", "skipped", trusted_as)] if not known and not untrusted else []
    if known and untrusted:  # a pin that is not the trusted recipe: judged by the trusted one, never by the pin
        trusted = trust.recipes[e.recipe][0]
        try:
            pinned = trusted.with_overrides(**_trusted_overrides(pinned))
        except OmniError:
            pinned = trusted
        comp, scheme = (m["artifact"].get("component") or {}).get("name"), (m.get("scheme") or {}).get("name")
        th = list(pinned.thresholds_for(comp, scheme))
    cases.append(_steps_case(m, pinned, base))

    local = m["verdict"].get("local") or m["verdict"]  # with AI Hub sections: the local verdict is kept inside
    fproblems = _cross_check(local, metrics, "")
    ran = runs.measured(e.recipe, pin, aid)
    hashes = {fn: meta["sha256"] for fn, meta in m["artifact"]["files"].items()}
    if ran is None:
        fproblems.append(f"no run report of the pinned recipe under runs/{e.recipe}/ measured {aid}")
    else:
        if (ran[1].get("parity") or None) != metrics:
            fproblems.append(f"parity.metrics differ from what {ran[0]} recorded for {aid}")
        if ran[1].get("files") != hashes:
            fproblems.append(f"artifact.files' sha256 differ from the file hashes {ran[0]} recorded for {aid}"
                             if isinstance(ran[1].get("files"), dict) else f"{ran[0]} records no file hashes for {aid}")
    cases.append(_case("figures", fproblems, f"figures match the verdict's checks and {ran[0] if ran else '-'}"))

    outputs = _output_names(m)
    checks, figures, reasons = [], {}, []
    if metrics is None or not th:
        status = UNVERIFIED if metrics is None else BLOCKED
        reasons = list(local.get("reasons") or []) if metrics is None else ["no pinned thresholds to judge against"]
    else:
        try:
            v = judge(metrics, th, outputs, ((m.get("artifact") or {}).get("export") or {}).get("hidden_outputs"))
        except OmniError as err:
            v = {"status": BLOCKED, "reasons": [str(err)], "checks": []}
        status, reasons = v["status"], list(v["reasons"])
        checks, figures = _threshold_cases(v, base, tol)
        if status == PASS and local.get("status") == UNVERIFIED:  # measured off target: a pass is not verified
            status, reasons = UNVERIFIED, list(local.get("reasons") or [])
    hub = _hub_status(m, th, outputs, cases) if pinned is not None else []
    status = max([status] + hub, key=ORDER.index)
    cases.append(_verdict_case(e.shelf, status, reasons, m["verdict"].get("status"), allow_unverified))
    if pinned is not None and pinned.expect_blocked and status == PASS:
        cases.append(Case("expectation", "fail", f"recipe {e.recipe} expects every artifact blocked "
                                                  "(expect_blocked: true) and this one passes"))
    return ArtifactCheck(e.recipe, aid, e.shelf, e.where, status, m["parity"].get("runtime"),
                         (metrics or {}).get("steps"), cases + checks, figures, hashes)


def _checked(e: Entry, runs: Runs, base: dict | None, tol: Tolerances, allow_unverified: bool,
             trust: Trust) -> ArtifactCheck:
    """``check_entry``, with a manifest it cannot judge (a value of the wrong type or shape anywhere, nesting too
    deep) as one failing ``manifest`` case naming what was wrong, never a crash."""
    try:
        return check_entry(e, runs, base, tol, allow_unverified, trust)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError, OmniError) as err:
        what = f"{type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}"
        return ArtifactCheck(e.recipe, e.dir.name, e.shelf, e.where, BLOCKED, None, None,
                             [Case("manifest", "fail", f"{e.where}/manifest.json cannot be judged ({what})")])


def run_gate(root: Path, recipe: str | None = None, baseline: dict | None = None, baseline_name: str | None = None,
             tolerances: Tolerances = Tolerances(), allow_unverified: bool = False,
             trust: Trust | None = None) -> GateResult:
    """Judge every artifact of the store ``root`` (``trust``: the recipes CI trusts; default the shipped ones)."""
    root = Path(root)
    runs, trust = Runs(root), trust or Trust.named(None)
    base_arts = (baseline or {}).get("artifacts") or {}
    checked = []
    for e in scan(root, recipe):
        a = _checked(e, runs, base_arts.get(f"{e.recipe}/{e.dir.name}"), tolerances, allow_unverified, trust)
        if baseline is not None and a.key not in base_arts and a.figures:
            a.cases.append(Case("baseline", "pass", "new artifact: not in the baseline yet (add it with --write-baseline)"))
        checked.append(a)
    present = {a.key for a in checked}
    missing = [Case(k, "fail", f"{k} is in the baseline but not in the store (an artifact stopped being built)")
               for k in sorted(base_arts) if k not in present and (recipe is None or k.split("/", 1)[0] == recipe)]
    return GateResult(str(root), checked, missing, tolerances, baseline_name, allow_unverified)


__all__ = ["Tolerances", "GateResult", "ArtifactCheck", "Case", "Trust", "run_gate", "read_baseline", "baseline_from",
           "verify_files", "scan", "counts"]
