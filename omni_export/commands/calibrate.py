"""``omni-export calibrate RECIPE``: capture (or reuse) each component's calibration set, exactly as a run does.

The set lands in the store's step cache under the same key a recipe run uses, so the run that follows reuses it, and
its content hash is the one every artifact manifest records."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from rich.console import Console

from ..errors import EXIT_OK, RecipeError


def cmd_calibrate(args, console: Console) -> int:
    from ..artifacts.store import Store
    from ..families import load_prompt_set
    from ..pipeline import Pipeline
    from ..recipes import load_recipe

    recipe = load_recipe(args.name).with_overrides(preset=args.preset, seed=args.seed, checkpoint=args.checkpoint,
                                                   context=args.context)
    if args.max_samples is not None:
        if args.max_samples < 1:
            raise RecipeError("--max-samples must be >= 1")
        recipe = dataclasses.replace(recipe, calibration=dataclasses.replace(recipe.calibration,
                                                                             max_samples=args.max_samples))
    store = Store(Path(args.store))
    pipe = Pipeline(recipe, store, Console(stderr=True))
    prompts = load_prompt_set(recipe.prompts.calibration)
    for name, comp in pipe.load_components().items():
        cs = pipe.calibration_set(comp, prompts)
        console.print(f"{name}: calibration set {cs.hash} - {cs.samples} samples from prompt set "
                      f"{cs.prompt_set!r} -> {cs.dir}")
    return EXIT_OK


def register(sub, store_arg) -> None:
    p = sub.add_parser("calibrate", help="capture each component's calibration set from the fp32 pipeline")
    p.add_argument("name", help="a shipped recipe name or a path to a .yaml recipe")
    p.add_argument("--max-samples", type=int, help="samples kept per component (evenly spread over the captured steps)")
    from .options import model_args
    model_args(p)
    store_arg(p)
    p.set_defaults(func=cmd_calibrate)
