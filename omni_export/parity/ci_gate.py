"""The CI gate: re-check the artifacts in a store and fail when any shipped artifact's parity is not what it should be.

For every artifact on a shelf (``published``, ``blocked``, ``unverified``) it checks, as separate cases:

- ``files``: every file the manifest lists exists and has the sha256 and size the manifest recorded;
- ``verdict``: a blocked artifact fails; an unverified one fails too unless ``allow_unverified`` (then it is skipped,
  never passed); a ``pass`` verdict on a shelf other than ``published`` (or the reverse) fails;
- one case per threshold check (output x metric, as ``gate.judge`` lists them): the figure is judged again against the
  manifest's thresholds and compared with the committed baseline, where a regression beyond the declared tolerance
  fails even when the threshold is still met.

With ``rerun`` the figures come from executing the files again (see ``rerun_recipe``) instead of from the manifest.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..artifacts.hashing import hash_file, hash_value
from ..artifacts.store import SHELVES, Store, read_json, write_json_atomic
from ..errors import EXIT_BLOCKED, EXIT_OK, BadInput, StoreIOError
from .gate import BLOCKED, PASS, UNVERIFIED, Threshold, judge

BASELINE_SCHEMA = "omni-export/baseline/1"
RESULT_SCHEMA = "omni-export/gate/1"
LOWER_IS_BETTER = ("max_abs_err", "max_logprob_delta")
SHELF_OF = {PASS: "published", BLOCKED: "blocked", UNVERIFIED: "unverified"}


@dataclass(frozen=True)
class Tolerances:
    """How far a figure may fall behind its baseline before the gate fails, whatever the threshold says.

    ``db``: SNR, absolute dB. ``agreement``: token agreements and cosine, absolute fraction. ``ratio``: error
    magnitudes (max |err|, max |dlogp|), lower is better: fail above ``ratio`` x the baseline. The runtimes here are
    deterministic (the same file on the same inputs gives the same figures), so any move at all means the artifact,
    the reference or the runtime changed; the tolerances only leave room for a legitimate rebuild (a new toolchain
    reordering a sum) and are declared on the command line of the CI job, in the open."""
    db: float = 1.0
    agreement: float = 0.02
    ratio: float = 2.0

    def limit(self, metric: str, base: float) -> tuple[float, str]:
        """(the worst value still accepted, how it was derived)."""
        if metric == "snr_db":
            return base - self.db, f"baseline {base:.4g} - {self.db:g} dB"
        if metric in LOWER_IS_BETTER:
            return base * self.ratio, f"baseline {base:.4g} x {self.ratio:g}"
        return base - self.agreement, f"baseline {base:.4g} - {self.agreement:g}"

    def regressed(self, metric: str, value: float, base: float) -> bool:
        lim, _ = self.limit(metric, base)
        return value > lim if metric in LOWER_IS_BETTER else value < lim

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


@dataclass
class ArtifactCheck:
    recipe: str
    artifact_id: str
    shelf: str
    location: str
    verdict: str
    runtime: str | None
    steps: int | None
    rerun: bool
    cases: list[Case] = field(default_factory=list)
    figures: dict[str, float | None] = field(default_factory=dict)   # "output/metric" -> value, for the baseline
    files: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.recipe}/{self.artifact_id}"

    @property
    def outcome(self) -> str:
        states = {c.status for c in self.cases}
        return "fail" if "fail" in states else ("skipped" if "skipped" in states else "pass")

    def to_dict(self) -> dict:
        return {"recipe": self.recipe, "id": self.artifact_id, "shelf": self.shelf, "location": self.location,
                "verdict": self.verdict, "runtime": self.runtime, "steps": self.steps, "rerun": self.rerun,
                "outcome": self.outcome, "cases": [c.__dict__ for c in self.cases]}


@dataclass
class GateResult:
    store: str
    artifacts: list[ArtifactCheck]
    missing: list[Case]                      # baseline entries with no artifact in the store
    tolerances: Tolerances
    baseline: str | None
    allow_unverified: bool

    @property
    def failures(self) -> list[tuple[str, Case]]:
        out = [(a.key, c) for a in self.artifacts for c in a.cases if c.status == "fail"]
        return out + [(c.name, c) for c in self.missing]

    @property
    def exit_code(self) -> int:
        return EXIT_BLOCKED if self.failures else EXIT_OK

    def to_dict(self) -> dict:
        return {"schema": RESULT_SCHEMA, "store": self.store, "ok": not self.failures, "exit_code": self.exit_code,
                "baseline": self.baseline, "tolerances": self.tolerances.to_dict(),
                "allow_unverified": self.allow_unverified,
                "counts": counts(self), "artifacts": [a.to_dict() for a in self.artifacts],
                "missing_from_store": [c.__dict__ for c in self.missing],
                "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


def counts(res: GateResult) -> dict:
    cases = [c for a in res.artifacts for c in a.cases] + res.missing
    return {"artifacts": len(res.artifacts), "cases": len(cases),
            "failed": sum(c.status == "fail" for c in cases), "skipped": sum(c.status == "skipped" for c in cases)}


# -- reading the store ----------------------------------------------------------------------------
def load_manifests(root: Path, recipe: str | None = None) -> list[tuple[str, Path, dict]]:
    """(shelf, artifact directory, manifest) for every artifact in the store, optionally of one recipe."""
    root = Path(root)
    if not root.is_dir():
        raise BadInput(f"store {root} does not exist or is not a directory")
    out = []
    for shelf in SHELVES:
        for mf in sorted((root / shelf).glob(f"{recipe or '*'}/*/manifest.json")):
            try:
                m = json.loads(mf.read_text())
                _ = (m["artifact"]["files"], m["recipe"]["name"], m["verdict"]["status"], m["parity"], m["thresholds"])
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise BadInput(f"manifest {mf.relative_to(root)} is unreadable or malformed: {e}") from None
            out.append((shelf, mf.parent, m))
    if not out:
        what = f"artifacts of recipe {recipe!r}" if recipe else "artifacts"
        raise BadInput(f"store {root} has no {what} (no {'/'.join(SHELVES)}/<recipe>/<artifact>/manifest.json)")
    return out


def verify_files(artifact_dir: Path, manifest: dict) -> list[str]:
    """Problems with the artifact's files, each naming the file; empty when every file matches its manifest."""
    problems = []
    files = manifest["artifact"]["files"]
    if not files:
        problems.append("the manifest lists no files")
    for fn, meta in sorted(files.items()):
        p = artifact_dir / fn
        if not p.is_file():
            problems.append(f"{fn} is missing")
            continue
        digest = hash_file(p)
        if digest != meta["sha256"]:
            problems.append(f"{fn} was modified: sha256 {digest[:12]}… != manifest {meta['sha256'][:12]}…")
        elif p.stat().st_size != meta.get("bytes", p.stat().st_size):
            problems.append(f"{fn} has {p.stat().st_size} bytes, manifest says {meta['bytes']}")
    return problems


# -- baselines ------------------------------------------------------------------------------------
def read_baseline(path: Path) -> dict:
    return read_json(path, "baseline", lambda b: isinstance(b, dict) and b.get("schema") == BASELINE_SCHEMA
                     and isinstance(b.get("artifacts"), dict), " (create it with --write-baseline)")


def baseline_from(res: GateResult, previous: dict | None = None) -> dict:
    """A baseline of the figures in ``res``; entries of recipes not checked this time are kept from ``previous``."""
    recipes = {a.recipe for a in res.artifacts}
    kept = {k: v for k, v in ((previous or {}).get("artifacts") or {}).items() if k.split("/", 1)[0] not in recipes}
    arts = {a.key: {"runtime": a.runtime, "steps": a.steps, "files": a.files, "figures": a.figures}
            for a in res.artifacts if a.figures}
    return {"schema": BASELINE_SCHEMA, "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "artifacts": dict(sorted({**kept, **arts}.items()))}


# -- re-running parity ----------------------------------------------------------------------------
def find_run_report(root: Path, recipe: str, recipe_hash: str) -> tuple[Path, dict]:
    """The newest run report of ``recipe`` whose recipe (with its command-line overrides) hashes to ``recipe_hash``."""
    runs = sorted((Path(root) / "runs" / recipe).glob("*/report.json"), reverse=True)
    for p in runs:
        try:
            rep = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if hash_value(rep.get("recipe")) == recipe_hash:
            return p, rep
    raise BadInput(f"cannot rerun recipe {recipe}: no run report under runs/{recipe}/ has recipe hash "
                   f"{recipe_hash[:12]}… (the manifests name it; was runs/ removed?)")


def rerun_recipe(root: Path, recipe: str, recipe_hash: str, console: Console) -> dict[str, tuple[str, dict]]:
    """Execute the recipe's artifacts again; return artifact id -> (shelf, new manifest).

    The recipe is rebuilt from its run report (the exact recipe with overrides; its hash must match the manifests')
    and run by the ordinary pipeline against the same store: the fp32 reference, the calibration set and every
    export are finished steps in the cache, so they are reused, and the artifact files are executed again on the
    same runtimes. The caller checks that the files executed are byte-identical to the ones the manifests list."""
    from ..pipeline import Pipeline
    from ..recipes import parse_recipe

    path, rep = find_run_report(root, recipe, recipe_hash)
    r = parse_recipe(rep["recipe"], f"{path.parent.name}/report.json")
    if r.hash != recipe_hash:
        raise BadInput(f"run report {path.parent.name}/report.json does not rebuild recipe {recipe} (hash differs)")
    result = Pipeline(r, Store(root), console).run()
    out = {}
    for a in result.artifacts:
        out[a.artifact_id] = (a.shelf_dir.parent.parent.name, json.loads((a.shelf_dir / "manifest.json").read_text()))
    return out


# -- the gate -------------------------------------------------------------------------------------
def _output_names(m: dict) -> list[str]:
    comp = m["artifact"].get("component") or {}
    names = [o[0] for o in comp.get("outputs") or []]
    return names or list(((m["parity"].get("metrics") or {}).get("outputs") or {}))


def _check_cases(m: dict, metrics: dict | None, base: dict | None, tol: Tolerances) -> tuple[list[Case], dict]:
    """Judge ``metrics`` against the manifest's thresholds and the baseline: one case per check."""
    if metrics is None:
        return [], {}
    try:
        thresholds = [Threshold(**t) for t in m["thresholds"]]
    except TypeError as e:
        raise BadInput(f"artifact {m['artifact']['id']}: malformed threshold in manifest: {e}") from None
    verdict = judge(metrics, thresholds, _output_names(m))
    cases, figures = [], {}
    base_figs = (base or {}).get("figures") or {}
    for chk in verdict["checks"]:
        name, value = f"{chk['output']} {chk['metric']}", chk["value"]  # the case's name; messages omit it
        fkey = f"{chk['output']}/{chk['metric']}"
        figures[fkey] = value
        msgs = []
        if value is None:
            msgs.append(f"not measured (required {chk['bound']})")
        elif not chk["ok"]:
            msgs.append(f"{value:.4g} misses the threshold {chk['bound']}")
        b = base_figs.get(fkey)
        if value is not None and b is not None and tol.regressed(chk["metric"], value, b):
            lim, how = tol.limit(chk["metric"], b)
            op = "<=" if chk["metric"] in LOWER_IS_BETTER else ">="
            msgs.append(f"{value:.4g} regressed beyond the baseline: accepted {op} {lim:.4g} ({how})"
                        + (" although the threshold is met" if chk["ok"] else ""))
        cases.append(Case(name, "fail" if msgs else "pass", "; ".join(msgs) or
                          f"{value:.4g} {chk['bound']}" + (f", baseline {b:.4g}" if b is not None else ", no baseline"),
                          value, chk["bound"], b))
    return cases, figures


def _verdict_case(shelf: str, m: dict, allow_unverified: bool) -> Case:
    v = m["verdict"]
    status, reasons = v["status"], v.get("reasons") or []
    summary = (f"{len(reasons)} reason(s), first: {reasons[0]}" if len(reasons) > 1 else "; ".join(reasons))
    if SHELF_OF.get(status) != shelf:
        return Case("verdict", "fail", f"verdict {status!r} but the artifact is on the {shelf} shelf")
    if status == BLOCKED:
        return Case("verdict", "fail", f"blocked when it was built: {summary}")
    if status == UNVERIFIED:
        if allow_unverified:
            return Case("verdict", "skipped", f"unverified (allowed by --allow-unverified, not a pass): {summary}")
        return Case("verdict", "fail", f"unverified, no runtime here executed it: {summary}")
    return Case("verdict", "pass", "pass")


def run_gate(root: Path, recipe: str | None = None, baseline: dict | None = None, baseline_name: str | None = None,
             tolerances: Tolerances = Tolerances(), rerun: bool = False, allow_unverified: bool = False,
             console: Console | None = None) -> GateResult:
    root = Path(root)
    entries = load_manifests(root, recipe)
    problems = {d: verify_files(d, m) for _, d, m in entries}
    checked: list[ArtifactCheck] = []
    fresh: dict[str, dict[str, tuple[str, dict]]] = {}
    if rerun and not (root / "cache").is_dir():
        raise BadInput(f"cannot rerun: store {root} has no cache/ of finished steps, so the artifacts would be "
                       "rebuilt rather than re-executed; run the recipe instead")
    if rerun:
        for name in sorted({m["recipe"]["name"] for _, _, m in entries}):
            mine = [(d, m) for _, d, m in entries if m["recipe"]["name"] == name]
            if any(problems[d] for d, _ in mine):
                continue  # never re-execute (or re-shelve) a recipe whose files were tampered with
            hashes = {m["recipe"]["hash"] for _, m in mine}
            if len(hashes) != 1:
                raise BadInput(f"cannot rerun recipe {name}: its artifacts come from {len(hashes)} different recipe "
                               "versions; rerun the recipe first")
            fresh[name] = rerun_recipe(root, name, hashes.pop(), console or Console(stderr=True))

    base_arts = (baseline or {}).get("artifacts") or {}
    for shelf, d, m in entries:
        rname, aid = m["recipe"]["name"], m["artifact"]["id"]
        bad = problems[d]
        new = fresh.get(rname, {}).get(aid)
        cases = [Case("files", "fail" if bad else "pass",
                      "; ".join(bad) if bad else f"{len(m['artifact']['files'])} file(s) match their sha256")]
        if new is not None:
            new_shelf, new_m = new
            if {k: v["sha256"] for k, v in new_m["artifact"]["files"].items()} != \
                    {k: v["sha256"] for k, v in m["artifact"]["files"].items()}:
                cases.append(Case("rerun", "fail", "the rerun executed different files than the manifest lists "
                                                   "(missing cache or a non-reproducible export); not comparable"))
                new = None
            else:
                shelf, m = new_shelf, new_m
                cases.append(Case("rerun", "pass", f"re-executed on {m['parity']['runtime']}"))
        elif rerun and bad:
            cases.append(Case("rerun", "fail", "not re-executed: the files do not match their manifest"))
        cases.append(_verdict_case(shelf, m, allow_unverified))
        key = f"{rname}/{aid}"
        metrics = (m.get("parity") or {}).get("metrics")
        check_cases, figures = _check_cases(m, metrics, base_arts.get(key), tolerances)
        if baseline is not None and key not in base_arts and metrics is not None:
            cases.append(Case("baseline", "pass", "new artifact: not in the baseline yet (add it with --write-baseline)"))
        a = ArtifactCheck(rname, aid, shelf, f"{shelf}/{rname}/{aid}", m["verdict"]["status"], m["parity"].get("runtime"),
                          (metrics or {}).get("steps"), new is not None, cases + check_cases, figures,
                          {fn: meta["sha256"] for fn, meta in m["artifact"]["files"].items()})
        checked.append(a)

    present = {a.key for a in checked}
    missing = [Case(k, "fail", f"{k} is in the baseline but not in the store (an artifact stopped being built)")
               for k in sorted(base_arts) if k not in present and (recipe is None or k.split("/", 1)[0] == recipe)]
    return GateResult(str(root), checked, missing, tolerances, baseline_name, allow_unverified)


# -- outputs --------------------------------------------------------------------------------------
def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and one rename (no half-written summary)."""
    path = Path(path)
    tmp = path.parent / f".tmp-{path.name}-{uuid.uuid4().hex[:8]}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise StoreIOError(f"cannot write {path}: {e.strerror or e}") from None


def junit_xml(res: GateResult) -> ET.ElementTree:
    """One test suite per recipe, one test case per artifact x check (files, verdict, each output/metric)."""
    c = counts(res)
    top = ET.Element("testsuites", name="omni-export gate", tests=str(c["cases"]), failures=str(c["failed"]),
                     skipped=str(c["skipped"]), errors="0")
    by_recipe: dict[str, list[tuple[str, Case]]] = {}
    for a in res.artifacts:
        by_recipe.setdefault(a.recipe, []).extend((f"{a.artifact_id} :: {k.name}", k) for k in a.cases)
    for k in res.missing:
        r, aid = k.name.split("/", 1)
        by_recipe.setdefault(r, []).append((f"{aid} :: present", k))
    for recipe, cases in sorted(by_recipe.items()):
        suite = ET.SubElement(top, "testsuite", name=recipe, tests=str(len(cases)),
                              failures=str(sum(k.status == "fail" for _, k in cases)),
                              skipped=str(sum(k.status == "skipped" for _, k in cases)), errors="0")
        for name, k in cases:
            tc = ET.SubElement(suite, "testcase", classname=f"omni-export.{recipe}", name=name)
            if k.status == "fail":
                ET.SubElement(tc, "failure", message=k.message, type="parity").text = k.message
            elif k.status == "skipped":
                ET.SubElement(tc, "skipped", message=k.message)
            else:
                ET.SubElement(tc, "system-out").text = k.message
    ET.indent(top)
    return ET.ElementTree(top)


def _worst_snr_delta(a: ArtifactCheck) -> str:
    ds = [(k.value - k.baseline, k.name.split()[0]) for k in a.cases
          if k.name.endswith(" snr_db") and k.value is not None and k.baseline is not None]
    if not ds:
        return "-"
    d, out = min(ds, key=lambda t: t[0])  # ties: the first output (logits) is named
    return f"{d:+.1f} dB ({out})"


def _row(a: ArtifactCheck) -> list[str]:
    checks = [k for k in a.cases if k.bound is not None]
    files = next(k for k in a.cases if k.name == "files")
    return [a.recipe, a.artifact_id, a.shelf, a.runtime or "-", "ok" if files.status == "pass" else "MODIFIED",
            f"{sum(k.status == 'pass' for k in checks)}/{len(checks)}", _worst_snr_delta(a), a.outcome.upper()]


HEADERS = ["recipe", "artifact", "shelf", "runtime", "files", "checks ok", "worst SNR vs baseline", "result"]


def table(res: GateResult) -> Table:
    t = Table(title=f"omni-export gate: {res.store}" + (f" against {res.baseline}" if res.baseline else ""))
    for h in HEADERS:
        t.add_column(h, overflow="fold")
    for a in res.artifacts:
        row = _row(a)
        colour = {"pass": "green", "fail": "red", "skipped": "yellow"}[a.outcome]
        t.add_row(*row[:-1], f"[{colour}]{row[-1]}[/]")
    for k in res.missing:
        r, aid = k.name.split("/", 1)
        t.add_row(r, aid, "-", "-", "-", "-", "-", "[red]MISSING[/]")
    return t


def markdown(res: GateResult) -> str:
    c = counts(res)
    head = "✅ passed" if not res.failures else f"❌ failed ({c['failed']} of {c['cases']} checks)"
    lines = [f"## omni-export gate {head}", "",
             f"{c['artifacts']} artifact(s), {c['cases']} checks, {c['skipped']} skipped. Baseline: "
             f"{'`' + res.baseline + '`' if res.baseline else 'none'}; tolerances: SNR {res.tolerances.db:g} dB, "
             f"agreement {res.tolerances.agreement:g}, error ratio {res.tolerances.ratio:g}x.", "",
             "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for a in res.artifacts:
        row = _row(a)
        row[1] = f"`{row[1]}`"
        row[-1] = {"PASS": "✅ pass", "FAIL": "❌ **fail**", "SKIPPED": "⚠️ skipped"}[row[-1]]
        lines.append("| " + " | ".join(row) + " |")
    for k in res.missing:
        r, aid = k.name.split("/", 1)
        lines.append(f"| {r} | `{aid}` | - | - | - | - | - | ❌ **missing** |")
    if res.failures:
        lines += ["", "### Failures", ""]
        lines += [f"- `{key}`" + ("" if k.name == key else f" {k.name}") + f": {k.message}" for key, k in res.failures]
    skipped = [(a.key, k) for a in res.artifacts for k in a.cases if k.status == "skipped"]
    if skipped:
        lines += ["", "### Skipped (not passes)", ""] + [f"- `{key}`: {k.message}" for key, k in skipped]
    lines += ["", "Thresholds and the reason for each are in every artifact's manifest.json.", ""]
    return "\n".join(lines)


def write_outputs(res: GateResult, json_path: Path | None, junit_path: Path | None, md_path: Path | None) -> None:
    if json_path:
        write_json_atomic(Path(json_path), res.to_dict())
    if junit_path:
        write_text_atomic(Path(junit_path), ET.tostring(junit_xml(res).getroot(), encoding="unicode",
                                                         xml_declaration=True) + "\n")
    if md_path:
        write_text_atomic(Path(md_path), markdown(res))


__all__ = ["Tolerances", "GateResult", "ArtifactCheck", "Case", "run_gate", "read_baseline", "baseline_from",
           "verify_files", "load_manifests", "junit_xml", "markdown", "table", "write_outputs"]
