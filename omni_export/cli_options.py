"""Command-line options shared by several commands, declared once as argparse parent parsers.

``parents=[MODEL, STORE]`` on a subparser gives it the options that say which model a recipe runs on and where the
store is; ``hub_argv`` turns the ``recipe --hub`` options into a ``hub submit`` command line, so the hub command's
own parser (and its defaults) reads them.
"""
from __future__ import annotations

import argparse
import os

DEFAULT_STORE = "omni-export-out"


def _model() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("model")
    g.add_argument("--preset", help="model preset (e.g. tiny, full) instead of the recipe's")
    g.add_argument("--seed", type=int, help="seed for random weights")
    g.add_argument("--checkpoint", help="a Hugging Face-style checkpoint directory (config.json + *.safetensors) or a "
                   ".gguf file")
    g.add_argument("--context", type=int, help="context length of the exported graphs")
    g.add_argument("--option", action="append", metavar="COMPONENT.KEY=VALUE",
                   help="a component option over the recipe's (VALUE read as YAML; repeatable), e.g. prefill.rows=8")
    return p


def _device() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--device", help="target device or chipset: galaxy_s25 (SM8750), galaxy_s24 (SM8650)")
    return p


def _store() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--store", default=os.environ.get("OMNI_EXPORT_STORE", DEFAULT_STORE),
                   help=f"artifact store directory (default: $OMNI_EXPORT_STORE or ./{DEFAULT_STORE})")
    return p


def _writer() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--no-wait", action="store_true",
                   help="exit at once (code 5) when another run is writing the store, instead of waiting for it")
    return p


MODEL, DEVICE, STORE, WRITER = _model(), _device(), _store(), _writer()


def model_overrides(args: argparse.Namespace) -> dict:
    """The model options as ``Recipe.with_overrides`` keywords."""
    return {k: getattr(args, k, None) for k in ("preset", "seed", "checkpoint", "context", "option")}


def store_arg(p: argparse.ArgumentParser) -> None:
    """For command modules that still take ``register(subparsers, store_arg)``: adds ``--store`` to ``p``."""
    for action in STORE._actions:
        if action.dest == "store":
            p.add_argument(*action.option_strings, default=action.default, help=action.help)


def model_args(p: argparse.ArgumentParser) -> None:
    """For parsers built without ``parents``: adds the model options to ``p``."""
    for action in MODEL._actions:
        if action.dest != "help":
            p.add_argument(*action.option_strings, type=action.type, help=action.help)


def hub_argv(args: argparse.Namespace, recipe: str, device: str, dry_run: bool) -> list[str]:
    argv = ["hub", "submit", "--recipe", recipe, "--device", device, "--store", args.store]
    for k, v in model_overrides(args).items():
        for one in (v if isinstance(v, list) else [v]):
            if one is not None:
                argv += [f"--{k}", str(one)]
    return argv + (["--dry-run"] if dry_run else [])
