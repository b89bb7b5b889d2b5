"""The one command line: ``omni-export recipe NAME`` and friends. Exit codes: see ``omni_export.errors``."""
from __future__ import annotations

import argparse
import os
import signal
import sys
import traceback
from pathlib import Path

from rich.console import Console

from ..errors import EXIT_INTERNAL, EXIT_IO, EXIT_OK, BadInput, OmniError, is_disk_full
from .options import DEVICE, MODEL, STORE, WRITER, hub_argv, model_overrides, positive_int, store_arg

# Modules that add subcommands: each exposes ``register(subparsers, store_arg)`` and sets ``func`` on its parsers
# (``func(args, console) -> exit code``). A new command is one module plus one line here.
COMMAND_MODULES: tuple[str, ...] = (
    "omni_export.commands.calibrate",
    "omni_export.commands.sweep",
    "omni_export.commands.ci",
    "omni_export.hub.cli",
)
EXIT_TERMINATED = 143  # SIGTERM (128 + 15), handled like Ctrl-C


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is so it unwinds like Ctrl-C: temporaries removed, finished steps kept."""


REDELIVER_S = 0.05  # a SIGTERM that arrives during an import is delivered again this much later


def _importing(frame) -> bool:
    """Whether ``frame`` or a caller is inside an import. An exception raised there can stop a native extension's
    initialization half-way (seen with onnx's and onnxscript's, imported lazily by the exporters), and the process
    then crashes (SIGSEGV, abort) instead of unwinding."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _redeliver(signum) -> None:
    import threading
    t = threading.Timer(REDELIVER_S, os.kill, (os.getpid(), signum))
    t.daemon = True
    t.start()


def _on_sigterm(signum, frame):
    if _importing(frame):  # let the import finish: the signal comes again shortly
        _redeliver(signum)
        return
    raise Terminated()


def cmd_recipe(args, console: Console) -> int:
    from ..artifacts.store import Store
    from ..parity.report import table, text_table
    from ..pipeline import Pipeline
    from ..recipes import load_recipe

    recipe = load_recipe(args.name).with_overrides(**model_overrides(args), device=args.device,
                                                   simulator_steps=args.simulator_steps, parts=args.parts)
    console.print(f"[bold]omni-export recipe {recipe.name}[/]: {recipe.description}")
    store = Store(Path(args.store))
    pipe = Pipeline(recipe, store, Console(stderr=True), require_verified=args.require_verified)
    pipe.wait_for_store = not args.no_wait
    result = pipe.run()
    import json
    report = json.loads((result.report_dir / "report.json").read_text())
    console.print(table(report))
    if (texts := text_table(report)) is not None:  # greedy text per parity prompt, fp32 beside each artifact
        console.print(texts)
    for a in result.artifacts:
        where = a.shelf_dir.relative_to(Path(args.store)) if a.shelf_dir.is_relative_to(Path(args.store)) else a.shelf_dir
        console.print(f"  {a.status.upper():10s} {a.artifact_id} -> {Path(args.store) / where}")
    console.print(f"report: {result.report_dir / 'report.json'}")
    if args.hub:  # the same artifacts, compiled, profiled and verified on a real device through Qualcomm AI Hub
        hub_args = build_parser().parse_args(hub_argv(args, args.name, args.hub, args.hub_dry_run))
        return result.exit_code or hub_args.func(hub_args, console)
    return result.exit_code


def cmd_recipes(args, console: Console) -> int:
    from ..recipes import load_recipe, shipped

    for name in shipped():
        r = load_recipe(name)
        console.print(f"{name:28s} {r.description}")
    return EXIT_OK


def cmd_checkpoint(args, console: Console) -> int:
    """Write a seeded model as a checkpoint directory in its family's own layout (``Family.write_checkpoint``: what
    ``--checkpoint`` reads back for that family). Refuses an out-of-range seed, a regular file and a non-empty
    directory; ``--force`` replaces only the files this command writes, never removes anything else, and refuses a
    directory holding weight files the written layout would not name (they would stand beside it as stale shards)."""
    import shutil

    from ..artifacts.atomic import io_error, temp_path
    from ..families import build_model, check_seed, get_family

    check_seed(args.seed)
    fam = get_family(args.family)
    if args.preset not in fam.presets:
        raise BadInput(f"checkpoint: unknown preset {args.preset!r} for {args.family}; known: {', '.join(fam.presets)}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise BadInput(f"checkpoint: {out} is a file, not a directory; give a new or empty directory")
    present = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if present and not args.force:
        raise BadInput(f"checkpoint: directory {out} is not empty ({', '.join(present[:3])}"
                       f"{', ...' if len(present) > 3 else ''}); give a new or empty directory, or --force to replace "
                       f"only the files of the {args.family} checkpoint layout in it")
    b = build_model(args.family, args.preset, args.seed)
    staging = temp_path(out)
    fam.write_checkpoint(b, staging)
    written = sorted(p.relative_to(staging) for p in staging.rglob("*") if p.is_file())
    try:
        if out.exists():
            weights = (".safetensors", ".safetensors.index.json", ".pt", ".bin", ".gguf")
            stale = sorted(p.relative_to(out) for p in out.rglob("*")
                           if p.is_file() and p.name.endswith(weights) and p.relative_to(out) not in written)
            if stale:
                raise BadInput(f"checkpoint: {out} holds {stale[0].as_posix()}, which the {args.family} layout does not "
                               f"write: it would stand beside the new weights as a stale file; remove it or give a new "
                               f"directory")
        if not out.exists():
            os.replace(staging, out)
        else:
            for rel in written:  # one rename per file; files it did not write stay as they are
                (out / rel).parent.mkdir(parents=True, exist_ok=True)
                os.replace(staging / rel, out / rel)
    except OSError as e:
        raise io_error(e, out) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    console.print(f"wrote {args.out} ({b.source}, {args.family} layout, weights {b.weights_hash[:12]})")
    return EXIT_OK


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line usage error (exit 2): ``omni-export recipe: error: argument --seed: ...``. Every
    subparser is of this class too (``add_subparsers`` takes the parent's)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="omni-export", description=__doc__)
    ap.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("recipe", parents=[MODEL, DEVICE, STORE, WRITER],
                       help="run a recipe: export, calibrate, compile, verify parity, gate, store")
    p.add_argument("name", help="a shipped recipe name (see `omni-export recipes`) or a path to a .yaml recipe")
    p.add_argument("--simulator-steps", type=positive_int, help="graph calls per artifact on the QNN HTP simulator")
    p.add_argument("--parts", help="split each component's graph into N parts, or 'auto' (each part's fp32 weights <= 2 GiB)")
    p.add_argument("--hub", metavar="DEVICE", help="then compile, profile and verify the published QDQ artifacts on this "
                   "device through Qualcomm AI Hub (same as `omni-export hub submit`)")
    p.add_argument("--hub-dry-run", action="store_true", help="with --hub: print the AI Hub jobs instead of submitting")
    p.add_argument("--require-verified", action="store_true",
                   help="exit non-zero when an artifact cannot be verified on this machine")
    p.set_defaults(func=cmd_recipe)

    p = sub.add_parser("recipes", help="list shipped recipes")
    p.set_defaults(func=cmd_recipes)

    p = sub.add_parser("checkpoint", help="write a seeded model as a checkpoint directory")
    p.add_argument("out", help="a new or empty directory")
    p.add_argument("--family", default="spark")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true",
                   help="write into a non-empty directory (replaces only the files of the family's layout)")
    p.set_defaults(func=cmd_checkpoint)

    import importlib
    for mod in COMMAND_MODULES:
        importlib.import_module(mod).register(sub, store_arg)
    return ap


def _one_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else ""


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 160)
    err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if _main_thread() else None
    try:
        return args.func(args, console)
    except OmniError as e:
        if args.debug:
            traceback.print_exc()
        if is_disk_full(e) and e.exit_code != EXIT_IO:  # e.g. an exporter's error whose cause was a full disk
            err.print(f"[red]omni-export: io:[/] disk full: {e}", highlight=False, soft_wrap=True)
            return EXIT_IO
        err.print(f"[red]omni-export: {e.kind}:[/] {e}", highlight=False, soft_wrap=True)
        return e.exit_code
    except Terminated:
        err.print("omni-export: terminated (SIGTERM); finished steps are kept and a rerun resumes from them")
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        err.print("omni-export: interrupted; finished steps are kept and a rerun resumes from them")
        return 130
    except Exception as e:  # a full disk wherever it surfaced; otherwise a bug: one line, traceback with --debug
        if args.debug:
            traceback.print_exc()
        if is_disk_full(e):
            err.print(f"[red]omni-export: io:[/] disk full: {type(e).__name__}: {_one_line(e)}", highlight=False,
                      soft_wrap=True)
            return EXIT_IO
        err.print(f"[red]omni-export: internal error:[/] {type(e).__name__}: {_one_line(e)}"
                  " (rerun with --debug for the traceback)", highlight=False, soft_wrap=True)
        return EXIT_INTERNAL
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _main_thread() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


def entry() -> None:
    """The ``omni-export`` command. After a signal (SIGTERM 143, Ctrl-C 130) the run has already unwound (its
    temporaries removed, finished steps kept, the message printed): the process then exits at once, without the
    interpreter's teardown, where a native library's worker threads (onnxruntime, torch) could still abort it."""
    code = main()
    if code in (EXIT_TERMINATED, 130):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
