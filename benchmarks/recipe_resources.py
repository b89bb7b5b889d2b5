"""Wall time and peak RSS of every step of a recipe run, against the full-size budget, as JSON with provenance.

Runs the recipe in this process (the same Pipeline as ``omni-export recipe``); each stage's own peak resident memory
comes from the kernel's high-water mark, reset at the start of the stage (``omni_export.memory``). The budget of the
full-size recipe on a smaller laptop: every step <= 6 GiB peak RSS, and the model, fp32 references, calibration,
exports, context binaries and CPU parity <= 8 minutes on 2 cores (HTP simulator steps excluded; until 2026-12-03 the
budget was 8 GiB, and 15 minutes for the issue's shorter list, ``listed``).

    python benchmarks/recipe_resources.py spark_w8a16 --preset full --out benchmarks/results/spark_w8a16_full.json
    python benchmarks/recipe_resources.py spark_w8a16            # the tiny default, a couple of minutes

``--option prefill.simulator_calls=0`` sets a component option (YAML value) over the recipe's, e.g. to leave the
unbudgeted HTP simulator call out of a timing run (that artifact is then reported unverified).
"""
from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from omni_export.artifacts.provenance import git_revision, toolchain
from omni_export.artifacts.store import Store, write_json_atomic
from omni_export.pipeline import Pipeline
from omni_export.recipes import load_recipe

RSS_BUDGET = 6 * 2**30      # a smaller laptop
TIME_BUDGET_S = 8 * 60      # every step but the HTP simulator's parity, on 2 cores


def counted(stage: str) -> bool:
    """Stages inside the time budget: everything but parity on the HTP simulator (and the end-to-end check). It
    also counts the model, the fp32 reference and the fp32 ONNX parity, which the earlier list (``listed``) left out."""
    return not (stage.startswith("parity") and "qnn_context" in stage) and stage != "end to end"


def listed(stage: str) -> bool:
    """The issue's list: export (every target, context binaries included) + calibration + CPU-QDQ parity."""
    return stage.startswith(("export ", "calibration ")) or (stage.startswith("parity ") and "qdq_onnx" in stage)


def summarize(stages: dict) -> dict:
    budget_s = sum(v["seconds"] for k, v in stages.items() if counted(k))
    listed_s = sum(v["seconds"] for k, v in stages.items() if listed(k))
    peak = max((v["peak_rss_bytes"] or 0) for v in stages.values())
    return {"peak_rss_bytes": peak, "budgeted_seconds": round(budget_s, 1),
            "within_budget": peak <= RSS_BUDGET and budget_s <= TIME_BUDGET_S,
            "listed_seconds": round(listed_s, 1), "listed_within_budget": peak <= RSS_BUDGET and listed_s <= TIME_BUDGET_S,
            "listed": "export (context binaries included) + calibration + CPU-QDQ parity, the earlier list; "
                      "budgeted_seconds also counts the model, fp32 reference and fp32 ONNX parity"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe")
    ap.add_argument("--preset")
    ap.add_argument("--context", type=int)
    ap.add_argument("--simulator-steps", type=int)
    ap.add_argument("--option", action="append", default=[], metavar="COMPONENT.KEY=VALUE",
                    help="a component option over the recipe's (repeatable)")
    ap.add_argument("--store", help="artifact store (default: a fresh temporary directory, kept)")
    ap.add_argument("--out", default="recipe_resources.json")
    ap.add_argument("--resummarize", metavar="JSON", help="recompute the totals of an earlier result file, in place")
    args = ap.parse_args(argv)
    if args.resummarize:
        import json
        res = json.loads(Path(args.resummarize).read_text())
        res["measured"] = summarize(res["stages"])
        write_json_atomic(Path(args.resummarize), res)
        print(res["measured"])
        return 0
    recipe = load_recipe(args.recipe).with_overrides(preset=args.preset, context=args.context,
                                                      simulator_steps=args.simulator_steps, option=args.option)
    store = Store(Path(args.store or tempfile.mkdtemp(prefix="omni-bench-")))
    pipe = Pipeline(recipe, store, Console(stderr=True))
    res = pipe.run()
    stages = {k: {"seconds": pipe.timings[k], "peak_rss_bytes": pipe.peak_rss.get(k),
                  "in_time_budget": counted(k)} for k in pipe.timings}
    measured = summarize(stages)
    budget_s, peak = measured["budgeted_seconds"], measured["peak_rss_bytes"]
    result = {"benchmark": "recipe steps: wall time and peak RSS", "recipe": recipe.name, "preset": args.preset,
              "options": recipe.options, "simulator_steps": recipe.parity.simulator_steps,
              "context": recipe.context, "cpus": os.cpu_count(), "exit_code": res.exit_code,
              "budget": {"peak_rss_bytes": RSS_BUDGET, "seconds": TIME_BUDGET_S},
              "measured": measured,
              "stages": stages, "model": pipe.bundle.provenance(), "toolchain": toolchain(),
              "source_revision": git_revision()}
    write_json_atomic(Path(args.out), result)
    t = Table(title=f"{recipe.name} preset {args.preset or recipe.model.preset}: per step")
    for c in ("stage", "seconds", "peak RSS GiB", f"in {TIME_BUDGET_S // 60}-min budget"):
        t.add_column(c)
    for k, v in stages.items():
        t.add_row(k, f"{v['seconds']:.1f}", f"{(v['peak_rss_bytes'] or 0) / 2**30:.2f}", "yes" if v["in_time_budget"] else "no")
    t.add_row("[bold]budgeted total / max[/]", f"{budget_s:.1f}", f"{peak / 2**30:.2f}",
              "[green]within budget[/]" if result["measured"]["within_budget"] else "[red]over budget[/]")
    t.add_row("[bold]issue's list (export + calibration + CPU-QDQ parity)[/]", f"{measured['listed_seconds']:.1f}", "",
              "[green]within budget[/]" if measured["listed_within_budget"] else "[red]over budget[/]")
    Console().print(t)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
