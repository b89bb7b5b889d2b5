"""Command-line options shared by several commands, declared once as argparse parent parsers.

``parents=[MODEL, STORE]`` on a subparser gives it the options that say which model a recipe runs on and where the
store is; ``hub_argv`` turns the ``recipe --hub`` options into a ``hub submit`` command line, so the hub command's
own parser (and its defaults) reads them.
"""
from __future__ import annotations

import argparse
import math
import os

DEFAULT_STORE = "omni-export-out"


def _int(text: str, lo: int, hi: int | None, what: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if v < lo or (hi is not None and v > hi):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text[:40]}")
    return v


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    return _int(text, 1, None, "an integer >= 1")


def seed_int(text: str) -> int:
    """An argparse type: a seed a recipe takes (``recipes.SEED_MAX``; imported here, so ``--help`` stays quick)."""
    from ..recipes import SEED_MAX
    return _int(text, 0, SEED_MAX, f"a seed from 0 to {SEED_MAX}")


def context_int(text: str) -> int:
    """An argparse type: a context length >= 2 (the recipe bounds it from above)."""
    return _int(text, 2, None, "a context length >= 2")


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds > 0 (nan, inf, 0 and negative numbers are refused)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds > 0, got {text}")
    return v


def _model() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("model")
    g.add_argument("--preset", help="model preset (e.g. tiny, full) instead of the recipe's")
    g.add_argument("--seed", type=seed_int, help="seed for random weights")
    g.add_argument("--checkpoint", help="a Hugging Face-style checkpoint directory (config.json + *.safetensors) or a "
                   ".gguf file")
    g.add_argument("--context", type=context_int, help="context length of the exported graphs")
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
            append = isinstance(action, argparse._AppendAction)
            p.add_argument(*action.option_strings, type=action.type, help=action.help, metavar=action.metavar,
                           action="append" if append else "store")


def hub_argv(args: argparse.Namespace, recipe: str, device: str, dry_run: bool) -> list[str]:
    argv = ["hub", "submit", "--recipe", recipe, "--device", device, "--store", args.store]
    for k, v in model_overrides(args).items():
        for one in (v if isinstance(v, list) else [v]):
            if one is not None:
                argv += [f"--{k}", str(one)]
    return argv + (["--dry-run"] if dry_run else [])
