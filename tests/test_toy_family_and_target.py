"""Adding a model family and a target touches no existing file: a toy family (model, component, prompt sets) and a
toy target live in a package of their own (under ``tmp_path``), are registered through the public registration
points only (``families.register_family``, ``exporters.register_target``), and a recipe runs through them end to end:
export, parity against eager fp32, the gate, the shelf. docs/design.md "Adding things" walks through this package."""
import hashlib
import json
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import omni_export
from omni_export import exporters, families
from omni_export.artifacts.store import Store
from omni_export.pipeline import Pipeline
from omni_export.recipes import load_recipe

PACKAGE = '''
"""A toy family: a two-layer tanh MLP over byte features, one component ``step``; and a toy target ``toy_half``
that ships fp16 weights and runs them on torch CPU."""
import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from omni_export.components.base import Component, Sequence, TensorSpec
from omni_export.exporters import Built, Execution, Target
from omni_export.families import Family

WIDTH = 16


@dataclass(frozen=True)
class ToyConfig:
    hidden: int = 32
    out: int = 4
    vocab_size: int = 300          # the byte tokenizer the bundle carries needs >= 259 ids

    def to_hf(self) -> dict:
        return {"model_type": "toy", "hidden": self.hidden, "out": self.out, "vocab_size": self.vocab_size}


class ToyNet(nn.Module):
    def __init__(self, cfg: ToyConfig):
        super().__init__()
        self.config = cfg
        self.fc1, self.fc2 = nn.Linear(WIDTH, cfg.hidden), nn.Linear(cfg.hidden, cfg.out)

    def forward(self, x):
        return (self.fc2(torch.tanh(self.fc1(x))),)


def init_random(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / 4)
    return model


class ToyStep(Component):
    name, kind = "step", "tensor"

    def __init__(self, bundle, context: int):
        self.module, self.tokenizer = bundle.module, bundle.tokenizer

    def input_specs(self):
        return [TensorSpec("x", (1, WIDTH))]

    def output_specs(self):
        return [TensorSpec("y", (1, self.module.config.out))]

    def describe(self):
        return {"name": self.name, "inputs": [["x", [1, WIDTH]]], "host": "prompt bytes / 259 as 16 features"}

    def _inputs(self, prompts):
        for p in prompts.prompts:
            ids = self.tokenizer.encode(p, WIDTH)
            x = np.zeros((1, WIDTH), np.float32)
            x[0, :len(ids)] = np.asarray(ids, np.float32) / 259.0
            yield x

    def reference(self, prompts, opts):
        run = self.eager_runner()
        return [Sequence([], 0, {"y": run({"x": x})[0][None], "in.x": x[None]}) for x in self._inputs(prompts)]

    def calibration_steps(self, prompts, opts):
        return len(prompts.prompts)

    def calibration_feeds(self, prompts, opts):
        for x in self._inputs(prompts):
            yield {"x": x}

    def trace(self, run, reference, max_steps):
        return [Sequence([], 0, {"y": run({"x": r.outputs["in.x"][0]})[0][None]}) for r in reference]


FAMILY = Family(name="toy", presets={"tiny": ToyConfig()}, config_from_hf=lambda d: ToyConfig(d["hidden"], d["out"]),
                config_to_hf=ToyConfig.to_hf, build=ToyNet, init_random=init_random,
                expected_keys=lambda m: {k: tuple(v.shape) for k, v in m.state_dict().items()},
                components={"step": ToyStep}, prompts=Path(__file__).parent / "prompts")


class HalfWeights(Target):
    name, format, version, schemes = "toy_half", "toy-pt", "1", ("fp16",)

    def export(self, req, out):
        files = {}
        for g in req.component.each_graph():
            module = req.component.export_module(self.name, g, req.scheme)
            torch.save({k: v.half() for k, v in module.state_dict().items()}, out / f"{g.name}.pt")
            files[g.name] = f"{g.name}.pt"
        return Built(self.name, req.scheme.name, out, files, {"weights": "fp16", "compute": "fp32"})

    def execution(self, built, component, device):
        runners = {}
        for g in component.graphs():
            module = copy.deepcopy(g.module)
            module.load_state_dict({k: v.float() for k, v in torch.load(built.path(g.name)).items()})
            runners[g.name] = component.eager_runner(module, [s.name for s in g.inputs])
        return Execution("torch-cpu (fp16 weights)", component.chain(runners))


TARGET = HalfWeights()
'''

RECIPE = '''
name: toy_fp16
description: the toy family's step with fp16 weights on the toy target, gated against eager fp32
model: {family: toy, preset: tiny, seed: 0}
components: [step]
context: 8
device: galaxy_s25
prompts: {calibration: toy_calibration, parity: toy_parity, max_prompt_tokens: 16}
parity: {new_tokens: 1}
builds:
  - {target: toy_half, scheme: fp16}
thresholds:
  fp16:
    - metric: snr_db
      outputs: "*"
      min: 45
      reason: fp16 weights round each weight to 11 bits (~66 dB a rounding); below 45 dB the export changed the function.
'''


def _tree_hash(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(p.relative_to(root).as_posix().encode() + p.read_bytes())
    return h.hexdigest()


@pytest.fixture
def toy(tmp_path, monkeypatch):
    pkg = tmp_path / "plugins" / "toy_omni"
    (pkg / "prompts").mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(PACKAGE))
    (pkg / "prompts" / "toy_parity.txt").write_text("# held-out\nThe cat sat.\nA dog ran home.\nRain again today.\n")
    (pkg / "prompts" / "toy_calibration.txt").write_text("Hello world.\nSome other text.\n")
    (tmp_path / "toy_fp16.yaml").write_text(RECIPE)
    monkeypatch.syspath_prepend(str(tmp_path / "plugins"))
    import toy_omni
    families.register_family(toy_omni.FAMILY)
    exporters.register_target(toy_omni.TARGET)
    yield tmp_path
    families.unregister_family("toy")
    exporters.unregister_target("toy_half")
    sys.modules.pop("toy_omni", None)


def test_a_toy_family_and_target_run_a_recipe_without_touching_any_existing_file(toy):
    package_root = Path(omni_export.__file__).parent
    before = _tree_hash(package_root)
    recipe = load_recipe(str(toy / "toy_fp16.yaml"))
    res = Pipeline(recipe, Store(toy / "store")).run()
    assert res.exit_code == 0
    (art,) = res.artifacts
    assert (art.target, art.scheme, art.status) == ("toy_half", "fp16", "pass")
    snr = art.parity["outputs"]["y"]["snr_db"]
    assert 55 < snr < 90, snr  # fp16 weight rounding: well above the 45 dB bar, far from fp32's exactness
    assert art.parity["sequences"] == 3  # one per parity prompt (the comment line is skipped)
    m = json.loads((art.shelf_dir / "manifest.json").read_text())
    assert m["model"]["family"] == "toy" and m["artifact"]["export"] == {"weights": "fp16", "compute": "fp32"}
    assert _tree_hash(package_root) == before  # no file of the package was written


def test_registration_points_refuse_a_second_registration_of_a_name(toy):
    import toy_omni
    from omni_export.errors import RecipeError
    with pytest.raises(RecipeError, match="model family 'toy' is already registered"):
        families.register_family(toy_omni.FAMILY)
    with pytest.raises(RecipeError, match="target 'toy_half' is already registered"):
        exporters.register_target(toy_omni.TARGET)


# A metric is one registration too (``parity.metric_specs``): the gate judges a threshold on it, ``compare`` measures
# it on every output, the CI gate recomputes the verdict and knows which way it regresses, and nothing else changes.
TOY_METRIC = '''
import numpy as np

from omni_export.parity.metric_specs import MetricSpec, register


def rel_l2_err(ref, test):
    ref, test = ref.astype(np.float64), test.astype(np.float64)
    return float(np.linalg.norm(ref - test) / max(np.linalg.norm(ref), 1e-30))


SPEC = register(MetricSpec("rel_l2_err", "output", lower_is_better=True, tolerance="ratio", compute=rel_l2_err,
                           digits=8, about="|test - ref| / |ref| (L2), over every step compared"))
'''


@pytest.fixture
def toy_metric(toy):
    from omni_export.parity.metric_specs import unregister
    (toy / "plugins" / "toy_metric.py").write_text(TOY_METRIC)
    import toy_metric
    yield toy_metric
    unregister("rel_l2_err")
    sys.modules.pop("toy_metric", None)


@pytest.mark.parametrize("bound,status", [(3e-3, "pass"), (1e-7, "blocked")])
def test_a_toy_metric_is_measured_judged_and_recomputed_by_the_ci_gate(toy, toy_metric, bound, status):
    from omni_export.commands.cli import main
    from omni_export.errors import EXIT_BLOCKED, EXIT_OK, RecipeError
    package_root = Path(omni_export.__file__).parent
    before = _tree_hash(package_root)
    recipe = toy / "toy_metric.yaml"
    recipe.write_text(RECIPE.replace("name: toy_fp16", "name: toy_metric") + f'''    - metric: rel_l2_err
      outputs: y
      max: {bound}
      reason: fp16 weights move a tanh MLP's output by ~1e-4 of its norm; the toy bar under test.
''')
    res = Pipeline(load_recipe(str(recipe)), Store(toy / "store")).run()
    (art,) = res.artifacts
    fig = art.parity["outputs"]["y"]["rel_l2_err"]
    assert 1e-6 < fig < 3e-3, fig  # fp16 weights: a real, small relative error
    (check,) = [c for c in art.checks if c["metric"] == "rel_l2_err"]
    assert check["value"] == fig and check["bound"] == f"<= {bound:g}" and art.status == status
    assert res.exit_code == (EXIT_OK if status == "pass" else EXIT_BLOCKED)
    # the CI gate re-judges the stored figures against the trusted recipe file: same verdict, same exit code
    gate = main(["gate", "--store", str(toy / "store"), "--trust", str(recipe), "--json", str(toy / "gate.json")])
    assert gate == (EXIT_OK if status == "pass" else EXIT_BLOCKED)
    cases = json.loads((toy / "gate.json").read_text())
    assert "rel_l2_err" in json.dumps(cases)
    from omni_export.audit.ci_gate import Tolerances
    assert Tolerances().regressed("rel_l2_err", 2.1 * fig, fig) and not Tolerances().regressed("rel_l2_err", fig, fig)
    with pytest.raises(RecipeError, match="'rel_l2_err' is already registered"):
        toy_metric.register(toy_metric.SPEC)
    assert _tree_hash(package_root) == before  # no file of the package was written


def test_an_lm_metric_with_compute_is_measured_over_the_teacher_forced_positions():
    """An LM metric registered with ``compute`` is measured by ``lm_figures`` on the positions the KL statistics use."""
    from omni_export.components.base import Sequence
    from omni_export.parity.metric_specs import MetricSpec, register, unregister
    from omni_export.parity.metrics import compare
    seen = []
    register(MetricSpec("toy_rows", "lm", positions="kld_positions", compute=lambda r, t: seen.append(r.shape) or 7.0,
                        about="rows it was given"))
    try:
        rng = np.random.default_rng(0)
        ref = Sequence(tokens=[1, 2, 3], outputs={"logits": rng.standard_normal((5, 1, 11)).astype(np.float32)},
                       n_prompt=3, generated=[4, 5, 6])
        test = Sequence(tokens=[1, 2, 3], outputs={"logits": ref.outputs["logits"] + 0.01}, n_prompt=3, generated=[])
        lm = compare([ref], [test], lm=True)["lm"]
    finally:
        unregister("toy_rows")
    assert lm["toy_rows"] == 7.0 and seen == [(4, 11)] and lm["kld_positions"] == 4  # positions 1..4
