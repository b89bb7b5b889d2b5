"""The CI gate's outputs: a terminal table (rich), JUnit XML (``junit-xml``), markdown (``tabulate``, through
``report.md_table``) and JSON.

Nothing here judges: every row is a ``ci_gate.GateResult`` as the gate computed it.
"""
from __future__ import annotations

from pathlib import Path

import junit_xml
from rich.table import Table
from ..artifacts.atomic import write_json_atomic, write_text_atomic
from .ci_gate import ArtifactCheck, GateResult, counts
from ..parity.report import md_table

HEADERS = ["recipe", "artifact", "shelf", "runtime", "files", "checks ok", "worst SNR vs baseline", "result"]


def _worst_snr_delta(a: ArtifactCheck) -> str:
    ds = [(k.value - k.baseline, k.name.split()[0]) for k in a.cases
          if k.name.endswith(" snr_db") and k.value is not None and k.baseline is not None]
    if not ds:
        return "-"
    d, out = min(ds, key=lambda t: t[0])  # ties: the first output (logits) is named
    return f"{d:+.1f} dB ({out})"


def _row(a: ArtifactCheck) -> list[str]:
    checks = [k for k in a.cases if k.bound is not None]
    files = next((k for k in a.cases if k.name == "files"), None)
    state = "NO MANIFEST" if files is None else "ok" if files.status == "pass" else "MODIFIED"
    return [a.recipe, a.artifact_id, a.shelf, a.runtime or "-", state,
            f"{sum(k.status == 'pass' for k in checks)}/{len(checks)}", _worst_snr_delta(a), a.outcome.upper()]


def _missing_rows(res: GateResult, mark: str) -> list[list[str]]:
    return [[*k.name.split("/", 1), "-", "-", "-", "-", "-", mark] for k in res.missing]


def table(res: GateResult) -> Table:
    t = Table(title=f"omni-export gate: {res.store}" + (f" against {res.baseline}" if res.baseline else ""))
    for h in HEADERS:
        t.add_column(h, overflow="fold")
    for a in res.artifacts:
        row = _row(a)
        colour = {"pass": "green", "fail": "red", "skipped": "yellow"}[a.outcome]
        t.add_row(*row[:-1], f"[{colour}]{row[-1]}[/]")
    for row in _missing_rows(res, "[red]MISSING[/]"):
        t.add_row(*row)
    return t


def markdown(res: GateResult) -> str:
    c = counts(res)
    head = "✅ passed" if not res.failures else f"❌ failed ({c['failed']} of {c['cases']} checks)"
    rows = []
    for a in res.artifacts:
        row = _row(a)
        row[1] = f"`{row[1]}`"
        row[-1] = {"PASS": "✅ pass", "FAIL": "❌ **fail**", "SKIPPED": "⚠️ skipped"}[row[-1]]
        rows.append(row)
    rows += [[r[0], f"`{r[1]}`", *r[2:]] for r in _missing_rows(res, "❌ **missing**")]
    lines = [f"## omni-export gate {head}", "",
             f"{c['artifacts']} artifact(s), {c['cases']} checks, {c['skipped']} skipped. Baseline: "
             f"{'`' + res.baseline + '`' if res.baseline else 'none'}; tolerances: SNR {res.tolerances.db:g} dB, "
             f"agreement {res.tolerances.agreement:g}, error ratio {res.tolerances.ratio:g}x.", "",
             md_table(HEADERS, rows)]
    if res.failures:
        lines += ["", "### Failures", ""]
        lines += [f"- `{key}`" + ("" if k.name == key else f" {k.name}") + f": {k.message}" for key, k in res.failures]
    skipped = [(a.key, k) for a in res.artifacts for k in a.cases if k.status == "skipped"]
    if skipped:
        lines += ["", "### Skipped (not passes)", ""] + [f"- `{key}`: {k.message}" for key, k in skipped]
    moved = res.extra.get("rerun", {}).get("moved") or []
    if moved:
        lines += ["", "### Figures that moved on the rerun", "",
                  md_table(["artifact", "figure", "audited", "rerun", "delta"],
                           [[m["artifact"], m["figure"], m["before"], m["after"], m["delta"]] for m in moved])]
    lines += ["", "Thresholds and the reason for each are in every artifact's manifest.json.", ""]
    return "\n".join(lines)


def junit_suites(res: GateResult) -> list[junit_xml.TestSuite]:
    """One test suite per recipe, one test case per artifact x check (manifest, files, recipe, steps, figures,
    verdict, each output/metric)."""
    by_recipe: dict[str, list[junit_xml.TestCase]] = {}
    named = [(a.recipe, a.artifact_id, k) for a in res.artifacts for k in a.cases]
    named += [(*k.name.split("/", 1), k) for k in res.missing]
    for recipe, aid, k in named:
        name = f"{aid} :: {k.name}" if k not in res.missing else f"{aid} :: present"
        tc = junit_xml.TestCase(name, classname=f"omni-export.{recipe}",
                                stdout=k.message if k.status == "pass" else None)
        if k.status == "fail":
            tc.add_failure_info(message=k.message, output=k.message, failure_type="parity")
        elif k.status == "skipped":
            tc.add_skipped_info(message=k.message)
        by_recipe.setdefault(recipe, []).append(tc)
    return [junit_xml.TestSuite(r, cases) for r, cases in sorted(by_recipe.items())]


def junit_text(res: GateResult) -> str:
    return junit_xml.to_xml_report_string(junit_suites(res), prettyprint=True, encoding="utf-8")


def output_problem(path: Path) -> str | None:
    """Why the gate or report may not write ``path`` (None when it is absent or a regular file): a symlink, FIFO,
    device, socket or directory is never replaced, whatever it points to."""
    import os
    import stat

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"cannot be inspected: {e.strerror or e}"
    if stat.S_ISREG(st.st_mode):
        return None
    from .gate_store import _kind

    return f"is {_kind(st.st_mode)}, not a regular file: refused, nothing written (give a new path or a regular file)"


def check_outputs(paths: dict[str, str | None]) -> None:
    """``{flag: path}``: one ``BadInput`` line for the first output path the gate may not write."""
    from ..errors import BadInput

    for flag, path in paths.items():
        if path and (why := output_problem(Path(path))):
            raise BadInput(f"{flag} {path} {why}")


def write_outputs(res: GateResult, json_path: Path | None, junit_path: Path | None, md_path: Path | None) -> None:
    """Write the requested outputs, each atomically and only over a regular file (``check_outputs``)."""
    check_outputs({"--json": json_path, "--junit": junit_path, "--markdown": md_path})
    if json_path:
        write_json_atomic(Path(json_path), res.to_dict())
    if junit_path:
        write_text_atomic(Path(junit_path), junit_text(res))
    if md_path:
        write_text_atomic(Path(md_path), markdown(res))
