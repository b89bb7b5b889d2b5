"""``omni-export sweep RECIPE``: every applicable scheme for every component of a recipe, through the one Pipeline.

Each scheme is one Pipeline run of the recipe with a single build (``qdq_onnx`` on ORT CPU for quantized schemes,
``qnn_context`` on the HTP simulator for fp16), so exports, references and calibration sets come from the same step
cache as ordinary runs. Thresholds: the recipe's own for a scheme when it declares them; otherwise a quantized
scheme is held to the recipe's ``w8a16`` bar (a scheme does not lower the bar for faithfulness), and a scheme with no
bar at all is reported as skipped, never as passing. Artifacts go to the shelves of ``<recipe>-sweep``; the table is
written to ``runs/<recipe>-sweep/<stamp>/sweep.json`` (key ``sweep``) and ``sweep.md``, with the per-layer
sensitivity of the calibrated w8a16 build (JSON + PNG) beside it.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..errors import EXIT_OK, OmniError, RecipeError
from .options import DEVICE, MODEL, STORE, model_overrides

SCHEMES = ("fp16", "w8a16", "w8a16_percentile", "w8a16_entropy", "w8a16_uncalibrated", "w4a16", "w4a16_uncalibrated",
           "w8a8", "w8a16_mixed")
BAR = "w8a16"  # the deployable bar quantized schemes inherit when the recipe declares none for them


def target_for(scheme: str) -> str:
    return "qnn_context" if scheme == "fp16" else "qdq_onnx"


def sweep_thresholds(recipe, component: str, scheme: str) -> tuple[tuple, str | None]:
    """(thresholds, where they came from) for one component and scheme."""
    from ..schemes import get_scheme

    own = recipe.thresholds_for(component, scheme)
    if own:
        return tuple(own), scheme
    if get_scheme(scheme).quantized and recipe.thresholds_for(component, BAR):
        return tuple(recipe.thresholds_for(component, BAR)), f"{BAR} (inherited)"
    return (), None


def _row(a, comp: str, scheme: str, bar: str | None, info: dict | None) -> dict:
    from ..parity.report import headline

    h = headline({"parity": a.parity})
    mixed = (info or {}).get("mixed_precision")
    return {"scheme": scheme, "component": comp, "target": a.target, "runtime": a.runtime, "status": a.status,
            "reasons": a.reasons, "logits_snr_db": h["main_snr"], "kv_min_snr_db": h["others_min"],
            "top1_agreement": h["top1"], "greedy_agreement": h["greedy"], "steps": h["steps"],
            "size_bytes": a.size_bytes, "thresholds_from": bar, "artifact": a.artifact_id,
            "overrides": {g: m["overrides"] for g, m in mixed.items()} if mixed else None}


def run_sweep(recipe, store, schemes=SCHEMES, simulator_steps: int | None = None, console: Console | None = None,
              sensitivity: bool = True) -> dict:
    from ..pipeline import Pipeline
    from ..recipes import Build

    console = console or Console(stderr=True)
    name = f"{recipe.name}-sweep"
    rows, bundle = [], None
    for s in schemes:
        bars = {c: sweep_thresholds(recipe, c, s) for c in recipe.components}
        comps = tuple(c for c in recipe.components if bars[c][0])
        for c in recipe.components:
            if not bars[c][0]:
                rows.append({"scheme": s, "component": c, "target": target_for(s), "status": "skipped",
                             "reasons": [f"the recipe declares no thresholds for {c}/{s} or {BAR}"]})
        if not comps:
            continue
        parity = recipe.parity if simulator_steps is None else dataclasses.replace(recipe.parity,
                                                                                    simulator_steps=simulator_steps)
        sub = dataclasses.replace(recipe, name=name, builds=(Build(target_for(s), s, comps),), parity=parity,
                                  thresholds={f"{c}/{s}": bars[c][0] for c in comps}, expect_blocked=False)
        console.rule(f"sweep {recipe.name}: {s}")
        pipe = Pipeline(sub, store, console, bundle=bundle)  # the model is built once for every scheme
        try:
            res = pipe.run()
        except OmniError as e:  # a refusal (e.g. no mixed-precision build passes) is a row, not the end of the sweep
            rows += [{"scheme": s, "component": c, "target": target_for(s), "status": "refused",
                      "reasons": [f"{e.kind}: {e}"], "thresholds_from": bars[c][1]} for c in comps]
            bundle = getattr(pipe, "bundle", bundle)
            continue
        bundle = pipe.bundle
        for a, (c, _) in zip(res.artifacts, sub.jobs()):
            manifest = json.loads((a.shelf_dir / "manifest.json").read_text())
            rows.append(_row(a, c, s, bars[c][1], manifest["artifact"]["export"]))
            if sensitivity and s == BAR and a.status != "unverified":
                _sensitivity(pipe.components[c], c, sub, a.shelf_dir, store.root / "runs" / name / "sensitivity")
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return {"recipe": recipe.name, "model": bundle.provenance() if bundle else None, "created": stamp,
            "schemes": list(schemes), "rows": rows}


def _sensitivity(comp, cname: str, recipe, shelf: Path, out_dir: Path) -> None:
    """Per-layer sensitivity of the calibrated w8a16 QDQ build on the parity prompts' inputs (JSON + PNG)."""
    import tempfile

    from ..artifacts.store import write_json_atomic
    from ..calibration import sensitivity
    from ..exporters.qdq_onnx import qdq_source
    from ..families import load_prompt_set
    from ..schemes import get_scheme

    prompts = load_prompt_set(recipe.prompts.parity)
    opts = {"max_prompt_tokens": recipe.prompts.max_prompt_tokens, "new_tokens": recipe.parity.new_tokens}
    feeds = list(comp.calibration_feeds(prompts, opts))  # the inputs the fp32 loop feeds over the parity prompts
    for g in comp.graphs():
        with tempfile.TemporaryDirectory(prefix="omni-sweep-") as td:
            src = Path(td) / "rewritten.onnx"
            qdq_source(comp, g, get_scheme(BAR), src)
            res = sensitivity.analyze(src, shelf / f"{g.name}.onnx", [comp.graph_feeds(f, g.name)[g.name] for f in feeds],
                                      f"parity prompt set {prompts.name} ({len(feeds)} graph calls)")
        stem = f"{cname}.{g.name}.{BAR}"
        write_json_atomic(out_dir / f"{stem}.json", res)
        sensitivity.plot(res, out_dir / f"{stem}.png", f"{recipe.name} {cname}/{g.name} {BAR}: per-layer SNR vs fp32")


def _fmt(v, nd=1):
    return "-" if v is None else (f"{v:.{nd}f}" if isinstance(v, float) else str(v))


def _verdict(r: dict) -> str:
    return r["status"].upper() + ("" if r["status"] == "pass" else ": " + "; ".join(r["reasons"][:2]))


def table(sweep: dict) -> Table:
    t = Table(title=f"omni-export sweep {sweep['recipe']}: scheme x component against eager fp32")
    for c in ("scheme", "component", "runtime", "logits dB", "K/V min dB", "top-1", "greedy", "size", "verdict"):
        t.add_column(c, overflow="fold")
    for r in sweep["rows"]:
        colour = {"pass": "green", "blocked": "red"}.get(r["status"], "yellow")
        t.add_row(r["scheme"], r["component"], r.get("runtime") or "-", _fmt(r.get("logits_snr_db")),
                  _fmt(r.get("kv_min_snr_db")), _fmt(r.get("top1_agreement"), 3), _fmt(r.get("greedy_agreement"), 3),
                  f"{r['size_bytes'] / 1e6:.2f} MB" if r.get("size_bytes") else "-", f"[{colour}]{_verdict(r)}[/]")
    return t


def markdown(sweep: dict) -> str:
    lines = [f"## omni-export sweep `{sweep['recipe']}`", "",
             f"Model: {(sweep.get('model') or {}).get('source', '-')}", "",
             "| scheme | component | runtime | logits dB | K/V min dB | top-1 | greedy | size (MB) | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in sweep["rows"]:
        size = f"{r['size_bytes'] / 1e6:.2f}" if r.get("size_bytes") else "-"
        lines.append(f"| `{r['scheme']}` | {r['component']} | {r.get('runtime') or '-'} | "
                     f"{_fmt(r.get('logits_snr_db'))} | {_fmt(r.get('kv_min_snr_db'))} | "
                     f"{_fmt(r.get('top1_agreement'), 3)} | {_fmt(r.get('greedy_agreement'), 3)} | {size} | "
                     f"{_verdict(r)} |")
    for r in sweep["rows"]:
        if r.get("overrides"):
            for g, o in r["overrides"].items():
                lines.append(f"\n`{r['scheme']}` {r['component']}/{g}: raised to int16: "
                             + (", ".join(f"`{w}`" for w in o) or "none (plain w8a16 already clears the bar)"))
    return "\n".join(lines + [""])


def write(sweep: dict, store) -> Path:
    from ..artifacts.store import write_json_atomic

    out = store.root / "runs" / f"{sweep['recipe']}-sweep" / sweep["created"]
    write_json_atomic(out / "sweep.json", {"sweep": sweep})
    (out / "sweep.md").write_text(markdown(sweep))
    return out


def schemes_for(recipe, arg: str | None) -> tuple[str, ...]:
    """The schemes a sweep runs: ``--schemes`` (comma-separated), else the recipe's ``sweep_schemes``, else
    ``SCHEMES``; an unknown or empty list is a one-line error."""
    from ..schemes import get_scheme

    schemes = tuple(s for s in arg.split(",") if s) if arg is not None else (recipe.sweep_schemes or SCHEMES)
    for s in schemes:
        get_scheme(s)
    if not schemes:
        raise RecipeError("--schemes names no scheme")
    return schemes


def cmd_sweep(args, console: Console) -> int:
    from ..artifacts.store import Store
    from ..recipes import load_recipe

    recipe = load_recipe(args.name).with_overrides(**model_overrides(args), device=args.device)
    schemes = schemes_for(recipe, args.schemes)
    store = Store(Path(args.store))
    sweep = run_sweep(recipe, store, schemes, args.simulator_steps, Console(stderr=True),
                      sensitivity=not args.no_sensitivity)
    out = write(sweep, store)
    console.print(table(sweep))
    console.print(f"sweep: {out / 'sweep.json'}")
    return EXIT_OK  # blocked rows are findings of the sweep, not a failure of it


def register(sub, store_arg) -> None:
    """The model, device and store options are the shared ones (``commands.options``), not declared here again."""
    p = sub.add_parser("sweep", help="run every scheme for every component and tabulate parity",
                       parents=[MODEL, DEVICE, STORE])
    p.add_argument("name", help="a shipped recipe name or a path to a .yaml recipe")
    p.add_argument("--schemes", help=f"comma-separated schemes (default: the recipe's sweep_schemes, else "
                                     f"{','.join(SCHEMES)})")
    p.add_argument("--simulator-steps", type=int, default=24, help="graph calls on the HTP simulator (fp16)")
    p.add_argument("--no-sensitivity", action="store_true", help="skip the per-layer sensitivity of w8a16")
    p.set_defaults(func=cmd_sweep)
