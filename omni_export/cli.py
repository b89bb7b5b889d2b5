"""The one command line: ``omni-export recipe NAME`` and friends. Exit codes: see ``omni_export.errors``."""
from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path

from rich.console import Console

from .errors import EXIT_INTERNAL, EXIT_OK, OmniError

DEFAULT_STORE = "omni-export-out"

# Modules that add subcommands: each exposes ``register(subparsers, store_arg)`` and sets ``func`` on its parsers
# (``func(args, console) -> exit code``). A new command is one module plus one line here.
COMMAND_MODULES: tuple[str, ...] = (
    "omni_export.calibration.command",
    "omni_export.sweep",
    "omni_export.commands_ci",
    "omni_export.hub.cli",
)


def model_args(p: argparse.ArgumentParser):
    """The options that say which model a recipe runs on (shared by every command that rebuilds a recipe's model)."""
    p.add_argument("--preset", help="model preset (e.g. tiny, full) instead of the recipe's")
    p.add_argument("--seed", type=int, help="seed for random weights")
    p.add_argument("--checkpoint", help="a Hugging Face-style checkpoint directory (config.json + *.safetensors)")
    p.add_argument("--context", type=int, help="context length of the exported graphs")


def _store_arg(p: argparse.ArgumentParser):
    p.add_argument("--store", default=os.environ.get("OMNI_EXPORT_STORE", DEFAULT_STORE),
                   help=f"artifact store directory (default: $OMNI_EXPORT_STORE or ./{DEFAULT_STORE})")


def cmd_recipe(args, console: Console) -> int:
    from .artifacts.store import Store
    from .parity.report import table
    from .pipeline import Pipeline
    from .recipes import load_recipe

    recipe = load_recipe(args.name).with_overrides(
        preset=args.preset, seed=args.seed, checkpoint=args.checkpoint, context=args.context, device=args.device,
        simulator_steps=args.simulator_steps, parts=args.parts)
    console.print(f"[bold]omni-export recipe {recipe.name}[/]: {recipe.description}")
    result = Pipeline(recipe, Store(Path(args.store)), Console(stderr=True),
                      require_verified=args.require_verified).run()
    import json
    report = json.loads((result.report_dir / "report.json").read_text())
    console.print(table(report))
    for a in result.artifacts:
        where = a.shelf_dir.relative_to(Path(args.store)) if a.shelf_dir.is_relative_to(Path(args.store)) else a.shelf_dir
        console.print(f"  {a.status.upper():10s} {a.artifact_id} -> {Path(args.store) / where}")
    console.print(f"report: {result.report_dir / 'report.json'}")
    if args.hub:  # the same artifacts, compiled, profiled and verified on a real device through Qualcomm AI Hub
        from .hub.cli import cmd_submit
        hub_args = argparse.Namespace(
            recipe=args.name, device=args.hub, artifact=None, target_runtime="qnn_context_binary", qairt_version=None,
            steps=None, preset=args.preset, seed=args.seed, checkpoint=args.checkpoint, context=args.context,
            poll_seconds=10.0, timeout_seconds=3 * 3600.0, dry_run=args.hub_dry_run, store=args.store)
        hub_code = cmd_submit(hub_args, console)
        return result.exit_code or hub_code
    return result.exit_code


def cmd_recipes(args, console: Console) -> int:
    from .recipes import load_recipe, shipped

    for name in shipped():
        r = load_recipe(name)
        console.print(f"{name:28s} {r.description}")
    return EXIT_OK


def cmd_checkpoint(args, console: Console) -> int:
    """Write a seeded model as a Hugging Face-style checkpoint directory."""
    from .models import build_model
    from .models.checkpoint import save_checkpoint

    b = build_model(args.family, args.preset, args.seed)
    state = {k: v for k, v in b.module.state_dict().items() if k in b.family.expected_keys(b.module)}
    save_checkpoint(state, b.family.config_to_hf(b.config), Path(args.out))
    console.print(f"wrote {args.out} ({b.source}, weights {b.weights_hash[:12]})")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="omni-export", description=__doc__)
    ap.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("recipe", help="run a recipe: export, calibrate, compile, verify parity, gate, store")
    p.add_argument("name", help="a shipped recipe name (see `omni-export recipes`) or a path to a .yaml recipe")
    model_args(p)
    p.add_argument("--device", help="target device or chipset: galaxy_s25 (SM8750), galaxy_s24 (SM8650)")
    p.add_argument("--simulator-steps", type=int, help="graph calls per artifact on the QNN HTP simulator")
    p.add_argument("--parts", help="split each component's graph into N parts, or 'auto' (each part's fp32 weights <= 2 GiB)")
    p.add_argument("--hub", metavar="DEVICE", help="then compile, profile and verify the published QDQ artifacts on this "
                   "device through Qualcomm AI Hub (same as `omni-export hub submit`)")
    p.add_argument("--hub-dry-run", action="store_true", help="with --hub: print the AI Hub jobs instead of submitting")
    p.add_argument("--require-verified", action="store_true",
                   help="exit non-zero when an artifact cannot be verified on this machine")
    _store_arg(p)
    p.set_defaults(func=cmd_recipe)

    p = sub.add_parser("recipes", help="list shipped recipes")
    p.set_defaults(func=cmd_recipes)

    p = sub.add_parser("checkpoint", help="write a seeded model as a checkpoint directory")
    p.add_argument("out")
    p.add_argument("--family", default="spark")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_checkpoint)

    import importlib
    for mod in COMMAND_MODULES:
        importlib.import_module(mod).register(sub, _store_arg)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 160)
    err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)
    try:
        return args.func(args, console)
    except OmniError as e:
        if args.debug:
            traceback.print_exc()
        err.print(f"[red]omni-export: {e.kind}:[/] {e}", highlight=False, soft_wrap=True)
        return e.exit_code
    except KeyboardInterrupt:
        err.print("omni-export: interrupted; finished steps are kept and a rerun resumes from them")
        return 130
    except Exception as e:  # a bug: say so in one line, traceback with --debug
        if args.debug:
            traceback.print_exc()
        err.print(f"[red]omni-export: internal error:[/] {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                  " (rerun with --debug for the traceback)", highlight=False, soft_wrap=True)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
