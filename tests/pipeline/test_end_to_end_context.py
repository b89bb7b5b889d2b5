"""A family's end-to-end check gets an ``EndToEndContext`` (recipe, a runner per artifact of the run, the store's memo),
not the pipeline: the toy family with an ``end_to_end`` of its own runs a recipe, re-opens its artifact through the
context, keeps a finished step through its memo (built once, read back by the next run), and the run report carries
what it returned."""
import dataclasses
import json

import numpy as np

from test_toy_family_and_target import toy  # noqa: F401  (the toy family's fixture)

from omni_export import families
from omni_export.artifacts.store import Store
from omni_export.pipeline import Pipeline
from omni_export.pipeline.end_to_end import EndToEndContext
from omni_export.recipes import load_recipe


def test_a_familys_end_to_end_gets_a_context_not_the_pipeline(toy):  # noqa: F811
    import toy_omni
    seen, built = [], []

    def end_to_end(ctx, comps, results):
        seen.append(ctx)
        (a,) = results
        run = ctx.runner(comps["step"], a)
        x = np.linspace(0, 1, 16, dtype=np.float32)[None]
        got, want = run({"x": x})[0], comps["step"].eager_runner()({"x": x})[0]

        def build(d):
            built.append(d)
            np.save(d / "got.npy", got)

        kept = np.load(ctx.memo("toy-end-to-end", {"x": x.tolist()}, build) / "got.npy")
        return {"prompt_set": ctx.recipe.prompts.parity, "max_abs": float(np.abs(got - want).max()),
                "kept_equals_got": bool(np.array_equal(kept, got))}

    families.unregister_family("toy")
    families.register_family(dataclasses.replace(toy_omni.FAMILY, end_to_end=end_to_end))
    recipe = load_recipe(str(toy / "toy_fp16.yaml"))
    for _ in range(2):
        res = Pipeline(recipe, Store(toy / "store")).run()
        assert res.exit_code == 0
    assert all(type(c) is EndToEndContext for c in seen) and len(seen) == 2
    assert len(built) == 1  # the memo's step: built by the first run, read back by the second
    assert dataclasses.is_dataclass(seen[0]) and seen[0].recipe is recipe and len(seen[0].results) == 1
    report = json.loads((res.report_dir / "report.json").read_text())["end_to_end"]
    assert report["prompt_set"] == "toy_parity" and report["kept_equals_got"]
    assert 0 < report["max_abs"] < 1e-2  # fp16 weights executed by the toy target's runtime, not eager fp32
