"""CI commands: ``omni-export gate`` (re-judge a store against the recipes its manifests pin and a baseline) and
``omni-export report`` (a self-contained HTML page per run). Judging lives in ``audit.ci_gate``, outputs in
``audit.gate_render``, pages in ``parity.html_report``.

``gate --rerun`` re-executes the audited store's recipes into a **fresh** store (the audited one is never written):
each recipe is rebuilt from the run report its manifests pin, with a copy of the audited store's cache of finished
steps less its parity measurements, so the same exports are executed again on the same runtimes; the fresh store is then gated like any other,
and every figure that moved between the two is reported with its delta.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import math
import shutil
from pathlib import Path

from rich.console import Console

from ..errors import EXIT_OK, BadInput


def _tolerances(args):
    from ..audit.ci_gate import Tolerances

    for flag, v, low in (("--tolerance-db", args.tolerance_db, 0.0), ("--tolerance-agreement", args.tolerance_agreement,
                                                                      0.0), ("--tolerance-ratio", args.tolerance_ratio, 1.0)):
        if not math.isfinite(v) or v < low:
            raise BadInput(f"{flag} {v!r}: must be a finite number >= {low:g}")
    return Tolerances(db=args.tolerance_db, agreement=args.tolerance_agreement, ratio=args.tolerance_ratio)


def rerun_store(audited: Path, fresh: Path, recipe: str | None, console: Console) -> list[str]:
    """Rebuild every recipe of ``audited`` whose files are intact into ``fresh``; return the recipes rerun."""
    from ..artifacts.atomic import clone_tree
    from ..artifacts.store import Store
    from ..audit.gate_store import Runs, scan, verify_files
    from ..pipeline import PARITY_STEP, Pipeline

    if not (audited / "cache").is_dir():
        raise BadInput(f"cannot rerun: store {audited} has no cache/ of finished steps, so the artifacts would be "
                       "rebuilt rather than re-executed; run the recipe instead")
    if fresh.exists() and any(fresh.iterdir()):
        raise BadInput(f"--rerun-store {fresh} is not empty; the rerun writes a fresh store")
    entries = [e for e in scan(audited, recipe) if e.manifest is not None]
    runs, done = Runs(audited), []
    # every finished step but the measurements (parity, and a family's ``parity-*`` steps, e.g. MiniCPM-o's
    # end-to-end chains): the same files are built from the cache and executed again
    for kind in sorted(k for k in (audited / "cache").iterdir()
                       if k.name != PARITY_STEP and not k.name.startswith(PARITY_STEP + "-")):
        clone_tree(kind, fresh / "cache" / kind.name)
    for name in sorted({e.recipe for e in entries}):
        mine = [e for e in entries if e.recipe == name]
        if any(verify_files(e.dir, e.manifest) for e in mine):
            console.print(f"[red]not rerun[/] {name}: its files do not match their manifests")
            continue
        pins = {e.manifest["recipe"]["hash"] for e in mine}
        if len(pins) != 1:
            raise BadInput(f"cannot rerun recipe {name}: its artifacts pin {len(pins)} different recipes; rerun it first")
        r, where = runs.pinned(name, pins.pop())
        if r is None:
            raise BadInput(f"cannot rerun recipe {name}: {where}")
        Pipeline(r, Store(fresh), console).run()
        done.append(name)
    return done


def moved_figures(audited, fresh) -> list[dict]:
    """Every figure (and file hash) that differs between the audited store's checks and the rerun's."""
    out = []
    after = {a.key: a for a in fresh.artifacts}
    for a in audited.artifacts:
        b = after.get(a.key)
        if b is None:
            if a.figures:
                out.append({"artifact": a.key, "figure": "*", "before": None, "after": None, "delta": "not rebuilt"})
            continue
        for k in sorted(set(a.figures) | set(b.figures)):
            x, y = a.figures.get(k), b.figures.get(k)
            if x != y:
                d = (y - x) if isinstance(x, (int, float)) and isinstance(y, (int, float)) else None
                out.append({"artifact": a.key, "figure": k, "before": x, "after": y,
                            "delta": f"{d:+.6g}" if d is not None else "-"})
        for fn in sorted(set(a.files) | set(b.files)):
            if a.files.get(fn) != b.files.get(fn):
                out.append({"artifact": a.key, "figure": f"file {fn}", "before": (a.files.get(fn) or "-")[:12],
                            "after": (b.files.get(fn) or "-")[:12], "delta": "other bytes"})
    return out


def add_rerun_cases(audited, fresh, moved: list[dict], tol) -> None:
    """One ``rerun`` case per audited artifact: the fresh store rebuilt it from the same files, its own gate passes,
    and no figure regressed beyond the tolerances against the audited figure (every move is listed either way)."""
    from ..audit.ci_gate import Case

    after = {a.key: a for a in fresh.artifacts}
    for a in audited.artifacts:
        b, mine = after.get(a.key), [m for m in moved if m["artifact"] == a.key]
        problems = []
        if b is None:
            problems.append("not rebuilt by the rerun (its files or manifest failed the audit, or the recipe dropped it)")
        else:
            problems += [f"{m['figure']} differs ({m['before']} -> {m['after']})" for m in mine
                         if m["figure"].startswith("file ")]
            problems += [f"{k.name}: {k.message}" for k in b.cases if k.status == "fail"]
            for m in mine:
                metric = m["figure"].split("/")[-1]
                if isinstance(m["before"], float) and isinstance(m["after"], float) and \
                        tol.regressed(metric, m["after"], m["before"]):
                    problems.append(f"{m['figure']} moved {m['delta']} ({m['before']:.6g} -> {m['after']:.6g})")
        moves = ", ".join(f"{m['figure']} {m['delta']}" for m in mine) or "no figure moved"
        a.cases.append(Case("rerun", "fail" if problems else "pass",
                            "; ".join(problems) if problems else f"re-executed on {b.runtime}: {moves}"))


def cmd_gate(args, console: Console) -> int:
    from ..artifacts.atomic import write_json_atomic
    from ..audit import ci_gate, gate_render
    from ..audit.trust import Trust

    if args.write_baseline and not args.baseline:
        raise BadInput("--write-baseline needs --baseline PATH (where to write it)")
    if args.rerun_store and not args.rerun:
        raise BadInput("--rerun-store needs --rerun")
    tol = _tolerances(args)
    gate_render.check_outputs({"--json": args.json, "--junit": args.junit, "--markdown": args.markdown,
                               "--baseline": args.baseline if args.write_baseline else None})
    trust = Trust.named(args.trust)
    baseline = None
    if args.baseline and not args.write_baseline:
        baseline = ci_gate.read_baseline(Path(args.baseline))
    store = Path(args.store)
    res = ci_gate.run_gate(store, recipe=args.recipe, baseline=baseline, baseline_name=args.baseline,
                           tolerances=tol, allow_unverified=args.allow_unverified, trust=trust)
    if args.reexecute:
        from ..audit.gate_store import scan
        from .reexecute import reexecute

        summary = reexecute(store, res, scan(store, args.recipe), trust, Console(stderr=True))
        res.extra["reexecute"] = summary
        console.print(f"reexecute: {summary['artifacts']} published artifact(s) executed again in "
                      f"{summary['seconds']:.1f} s")
    if args.rerun:
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        fresh = Path(args.rerun_store) if args.rerun_store else store.parent / f"{store.name}-rerun-{stamp}"
        err = Console(stderr=True)
        try:
            rerun = rerun_store(store, fresh, args.recipe, err)
        except BaseException:
            if not args.rerun_store:
                shutil.rmtree(fresh, ignore_errors=True)
            raise
        again = ci_gate.run_gate(fresh, recipe=args.recipe, tolerances=tol, allow_unverified=args.allow_unverified,
                                 trust=trust)
        moved = moved_figures(res, again)
        add_rerun_cases(res, again, moved, tol)
        res.extra["rerun"] = {"fresh_store": str(fresh), "recipes": rerun, "moved": moved,
                              "fresh_store_exit_code": again.exit_code}
        console.print(f"rerun: {len(rerun)} recipe(s) into the fresh store {fresh}; "
                      f"{len(moved)} figure(s) moved" + (":" if moved else ""))
        for m in moved:
            console.print(f"  {m['artifact']} {m['figure']}: {m['before']} -> {m['after']} ({m['delta']})",
                          highlight=False)
    console.print(gate_render.table(res))
    for key, case in res.failures:
        console.print(f"  [red]FAIL[/] {key}" + ("" if case.name == key else f" {case.name}") + f": {case.message}",
                      highlight=False, soft_wrap=True)
    gate_render.write_outputs(res, args.json, args.junit, args.markdown)
    code = res.exit_code
    if args.write_baseline:
        if code != EXIT_OK:
            console.print("[red]baseline not written[/]: the gate failed; fix the failures first")
        else:
            path = Path(args.baseline)
            previous = ci_gate.read_baseline(path) if path.exists() else None
            write_json_atomic(path, ci_gate.baseline_from(res.artifacts, previous))
            console.print(f"wrote baseline {path} ({len([a for a in res.artifacts if a.figures])} artifact(s))")
    c = ci_gate.counts(res)
    verdict = "[green]gate passed[/]" if code == EXIT_OK else f"[red]gate failed[/] (exit {code})"
    console.print(f"{verdict}: {c['artifacts']} artifact(s), {c['cases']} checks, {c['failed']} failed, "
                  f"{c['skipped']} skipped")
    return code


def cmd_report(args, console: Console) -> int:
    from ..parity import html_report

    pages = html_report.render_store(Path(args.store), recipe=args.recipe, run=args.run,
                                     out=Path(args.out) if args.out else None)
    for p in pages:
        console.print(f"report: {p}")
    return EXIT_OK


def register(sub, store_arg) -> None:
    p = sub.add_parser("gate", help="re-judge a store from its figures and the recipes its manifests pin; "
                                    "exit 1 on failure, 7 when an expect_blocked recipe's artifact passes")
    p.add_argument("--recipe", help="check only this recipe's artifacts (default: every artifact in the store)")
    p.add_argument("--trust", action="append", metavar="shipped|PATH",
                   help="a recipe CI trusts: 'shipped' (every shipped recipe, by name) or a recipe file; repeat it. "
                        "An artifact whose pinned recipe is not the trusted one of its name (with its command-line "
                        "overrides) fails, and with --trust every recipe in the store must be covered. Default: "
                        "shipped recipes are held to the shipped ones, others are judged by the store's copy "
                        "(reported as skipped)")
    p.add_argument("--reexecute", action=argparse.BooleanOptionalAction, default=False,
                   help="run every published artifact's files again on their runtimes (nothing rebuilt, fp32 "
                        "reference computed afresh) and fail on any figure that differs from the manifest's "
                        "(default: %(default)s)")
    p.add_argument("--rerun", action="store_true",
                   help="execute the artifacts again into a fresh store (the audited store's cache copied, so the "
                        "same files are re-executed), gate that store and report every figure that moved")
    p.add_argument("--rerun-store", help="with --rerun: where the fresh store goes (default: <store>-rerun-<stamp> "
                                         "beside the store)")
    p.add_argument("--baseline", help="baseline JSON of figures to compare with (committed next to the CI job)")
    p.add_argument("--write-baseline", action="store_true",
                   help="write the current figures to --baseline instead of comparing (only when the gate passes)")
    p.add_argument("--tolerance-db", type=float, default=1.0,
                   help="SNR may fall this many dB below the baseline (default: %(default)s)")
    p.add_argument("--tolerance-agreement", type=float, default=0.02,
                   help="token agreement / cosine may fall this much (absolute) below the baseline "
                        "(default: %(default)s)")
    p.add_argument("--tolerance-ratio", type=float, default=2.0,
                   help="error magnitudes (max |err|, max |dlogp|) may grow up to this factor over the baseline "
                        "(default: %(default)s)")
    p.add_argument("--allow-unverified", action="store_true",
                   help="report artifacts no runtime here can execute as skipped instead of failing (never as passed)")
    p.add_argument("--json", help="write the full result as JSON here")
    p.add_argument("--junit", help="write JUnit XML here (one test case per artifact x check)")
    p.add_argument("--markdown", help="write a markdown summary here (e.g. for $GITHUB_STEP_SUMMARY)")
    store_arg(p)
    p.set_defaults(func=cmd_gate)

    p = sub.add_parser("report", help="render a self-contained HTML page (with PNG plots) per run")
    p.add_argument("--recipe", help="only this recipe (default: the latest run of every recipe in the store)")
    p.add_argument("--run", help="a run directory or report.json to render (default: runs/<recipe>/latest.json)")
    p.add_argument("--out", help="output directory (default: <run directory>/html)")
    store_arg(p)
    p.set_defaults(func=cmd_report)
