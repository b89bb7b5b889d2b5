"""CI commands: ``omni-export gate`` (re-check a store against thresholds and a baseline) and ``omni-export report``
(a self-contained HTML page per run). Logic lives in ``parity.ci_gate`` and ``parity.html_report``."""
from __future__ import annotations

from pathlib import Path

from rich.console import Console

from .errors import EXIT_OK, BadInput


def cmd_gate(args, console: Console) -> int:
    from .artifacts.store import write_json_atomic
    from .parity import ci_gate

    if args.write_baseline and not args.baseline:
        raise BadInput("--write-baseline needs --baseline PATH (where to write it)")
    if args.tolerance_db < 0 or args.tolerance_agreement < 0 or args.tolerance_ratio < 1:
        raise BadInput("tolerances: --tolerance-db and --tolerance-agreement must be >= 0, --tolerance-ratio >= 1")
    tol = ci_gate.Tolerances(db=args.tolerance_db, agreement=args.tolerance_agreement, ratio=args.tolerance_ratio)
    baseline = None
    if args.baseline and not args.write_baseline:
        baseline = ci_gate.read_baseline(Path(args.baseline))
    res = ci_gate.run_gate(Path(args.store), recipe=args.recipe, baseline=baseline, baseline_name=args.baseline,
                           tolerances=tol, rerun=args.rerun, allow_unverified=args.allow_unverified,
                           console=Console(stderr=True))
    console.print(ci_gate.table(res))
    for key, case in res.failures:
        console.print(f"  [red]FAIL[/] {key}" + ("" if case.name == key else f" {case.name}") + f": {case.message}",
                      highlight=False, soft_wrap=True)
    ci_gate.write_outputs(res, args.json, args.junit, args.markdown)
    code = res.exit_code
    if args.write_baseline:
        if code != EXIT_OK:
            console.print("[red]baseline not written[/]: the gate failed; fix the failures first")
        else:
            path = Path(args.baseline)
            previous = ci_gate.read_baseline(path) if path.exists() else None
            write_json_atomic(path, ci_gate.baseline_from(res, previous))
            console.print(f"wrote baseline {path} ({len([a for a in res.artifacts if a.figures])} artifact(s))")
    c = ci_gate.counts(res)
    verdict = "[green]gate passed[/]" if code == EXIT_OK else "[red]gate failed[/]"
    console.print(f"{verdict}: {c['artifacts']} artifact(s), {c['cases']} checks, {c['failed']} failed, "
                  f"{c['skipped']} skipped")
    return code


def cmd_report(args, console: Console) -> int:
    from .parity import html_report

    pages = html_report.render_store(Path(args.store), recipe=args.recipe, run=args.run,
                                     out=Path(args.out) if args.out else None)
    for p in pages:
        console.print(f"report: {p}")
    return EXIT_OK


def register(sub, store_arg) -> None:
    p = sub.add_parser("gate", help="re-check a store: file hashes, verdicts, thresholds, baseline; exit 1 on failure")
    p.add_argument("--recipe", help="check only this recipe's artifacts (default: every artifact in the store)")
    p.add_argument("--rerun", action="store_true",
                   help="execute the artifacts again on the local runtimes (reruns the recipe against the same store: "
                        "cached steps are reused, the files must be byte-identical to their manifests)")
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

