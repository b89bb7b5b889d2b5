"""The run report: ``runs/<recipe>/<stamp>/report.json`` and ``report.md`` (and ``latest.json``) of a finished run,
with each artifact's verdict, figures, location and the sha256 of its shelved files as its manifest records them."""
from __future__ import annotations

import datetime as _dt
import json

from ..artifacts.atomic import write_json_atomic, write_text_atomic
from ..errors import EXIT_BLOCKED, EXIT_OK
from ..parity import gate
from ..parity.report import greedy_texts, markdown_summary
from .results import RunResult


def write_run_report(pipe, results, device, calibs, e2e: dict | None = None):
    """Write the report of ``pipe``'s run over ``results`` and return its ``RunResult`` (exit code included)."""
    r = pipe.recipe
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    bad = [a for a in results if a.status == gate.BLOCKED or (pipe.require_verified and a.status == gate.UNVERIFIED)]
    code = gate.expectation(r, results, EXIT_BLOCKED if bad else EXIT_OK, pipe.console.log)  # expect_blocked: 7
    report = {
        "recipe": r.to_dict(), "recipe_hash": r.hash, "device": device.to_dict(), "model": pipe.bundle.provenance(),
        "calibration": {k: c.provenance() for k, c in calibs.items()} or None, "timings_s": pipe.timings,
        "peak_rss_bytes": pipe.peak_rss, "exit_code": code, "created": stamp,
        "artifacts": [{"id": a.artifact_id, "target": a.target, "scheme": a.scheme, "status": a.status,
                       "reasons": a.reasons, "runtime": a.runtime, "parity": a.parity, "checks": a.checks,
                       "three_way_snr_db": a.three_way or None, "size_bytes": a.size_bytes,
                       "location": str(a.shelf_dir.relative_to(pipe.store.root)),
                       # the shelved files' sha256 as the manifest records them: the gate holds the two together
                       "files": {fn: meta["sha256"] for fn, meta in json.loads(
                           (a.shelf_dir / "manifest.json").read_text())["artifact"]["files"].items()}}
                      for a in results],
    }
    out = pipe.store.root / "runs" / r.name / stamp
    if e2e is not None:  # a family's files for a person (e.g. .wav) go next to the report
        writer = e2e.pop("write_files", None)
        report["end_to_end"] = {**e2e, "files": writer(out)} if writer else e2e
    report["greedy_text"] = greedy_texts(report, getattr(pipe.bundle, "tokenizer", None))  # parity.texts
    write_json_atomic(out / "report.json", report)
    write_text_atomic(out / "report.md", markdown_summary(report))
    write_json_atomic(pipe.store.root / "runs" / r.name / "latest.json", report)
    return RunResult(r.name, results, out, code, pipe.timings)
