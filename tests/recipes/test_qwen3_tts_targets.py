"""Qwen3-TTS on the ExecuTorch (XNNPACK) and CoreML targets: the graph forms XNNPACK delegates whole compute the same
function, and the shipped ``qwen3_tts_executorch`` recipe (one parity prompt) executes every .pte on the ExecuTorch
runtime through each component's host loop, publishes what passed and never publishes a blocked or CoreML artifact
(CoreML cannot execute on Linux)."""
import json
import sys
import tempfile
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
import yaml

from omni_export.artifacts.store import Store
from omni_export.commands.cli import main
from omni_export.errors import EXIT_BLOCKED, EXIT_OK
from omni_export.families.qwen3_tts.forms import xnnpack_forms
from omni_export.parity.metrics import snr_db
from omni_export.pipeline import Pipeline
from omni_export.recipes import load_recipe

NAME = "qwen3_tts_executorch"
COMPONENTS = ("talker_step", "code_predictor_step", "code2wav_first", "code2wav")
SHORT = ("talker_step", "code2wav")  # the components of the short recipe's quantized and CoreML builds


@pytest.fixture(scope="module")
def tts_components():
    with tempfile.TemporaryDirectory() as d:
        return Pipeline(load_recipe(NAME), Store(Path(d))).load_components()


def _feed(comp, seed=0):
    rng = np.random.default_rng(seed)
    feed = {s.name: (0.5 * rng.standard_normal(s.shape)).astype(np.float32) for s in comp.input_specs()}
    feed["mask"] = np.where(rng.random(feed["mask"].shape) < 0.2, -100.0, 0.0).astype(np.float32)
    if "head" in feed:
        feed["head"] = np.eye(feed["head"].shape[-1], dtype=np.float32)[5].reshape(feed["head"].shape)
    return feed


@pytest.mark.parametrize("name", COMPONENTS)
def test_xnnpack_forms_are_the_same_function(tts_components, name):
    """Grouped-query bmm attention, linear predictor heads, folded SnakeBeta, matmul norms: fp32 reordering only (the
    fp32 vs fp64 error of these graphs on random inputs is ~100 dB), far above the recipe's 90 dB bar."""
    comp = tts_components[name]
    feed = _feed(comp)
    ref, got = comp.eager_runner()(feed), comp.eager_runner(xnnpack_forms(comp.module))(feed)
    assert len(got) == len(ref)
    for r, g, s in zip(ref, got, comp.output_specs()):
        assert g.shape == r.shape and snr_db(r, g) > 95, s.name


def _short_recipe(tmp_path) -> Path:
    """The shipped recipe with one parity prompt (26 frames: the 1 + 25 serving schedule); builds and thresholds as
    shipped."""
    d = yaml.safe_load(resources.files("omni_export.recipes").joinpath(f"{NAME}.yaml").read_text())
    (tmp_path / "par.txt").write_text("The quick brown fox jumps over the lazy dog.\n")
    d["prompts"].update(parity=str(tmp_path / "par.txt"))
    d["options"] = {"code2wav_first": {"simulator_chunks": 1}, "code2wav": {"simulator_chunks": 1}}
    # the quantized and CoreML builds on one LM step and one Code2Wav chunk (``SHORT``), for CI time: each lowering or
    # conversion takes 10-20 s here, and the other two components are the same code paths (the shipped recipe's run
    # of all four: docs/targets.md); the fp32 programs of every component, which the end-to-end chain needs, as shipped
    for b in d["builds"]:
        if (b["target"], b["scheme"]) != ("executorch", "fp32"):
            b["components"] = list(SHORT)
    p = tmp_path / f"{NAME}.yaml"
    p.write_text(yaml.safe_dump(d, allow_unicode=True))
    return p


@pytest.mark.slow  # six XNNPACK lowerings, two CoreML conversions: 114-126 s in CI (eight and four: 220 s)
def test_qwen3_tts_executorch_recipe(tmp_path):
    store = tmp_path / "store"
    code = main(["recipe", str(_short_recipe(tmp_path)), "--store", str(store)])
    rep = json.loads((store / "runs" / NAME / "latest.json").read_text())
    arts = {(a["id"].split(".")[0], a["target"], a["scheme"]): a for a in rep["artifacts"]}
    assert set(arts) == {(c, "executorch", "fp32") for c in COMPONENTS} | {
        (c, t, s) for c in SHORT for t, s in (("executorch", "w8a8_dynamic"), ("coreml", "fp16"))}
    blocked = [a for a in arts.values() if a["status"] == "blocked"]
    assert code == (EXIT_BLOCKED if blocked else EXIT_OK)
    published = store / "published" / NAME

    for (comp, target, scheme), a in arts.items():
        if target == "coreml":
            continue
        # every .pte is executed by the ExecuTorch runtime (XNNPACK) and gated on its figures
        assert a["runtime"] == "executorch-runtime (XnnpackBackend)" and a["checks"], a["id"]
        if a["status"] == "blocked":  # only a dynamic-int8 Code2Wav chunk, at its 20 dB audio bar (docs/targets.md)
            assert (scheme, comp[:8]) == ("w8a8_dynamic", "code2wav"), (a["id"], a["reasons"])
            assert any(r.startswith("audio snr_db") for r in a["reasons"]), a["reasons"]
        else:
            assert a["status"] == "pass", (a["id"], a["status"], a["reasons"])
        m = json.loads((store / a["location"] / "manifest.json").read_text())
        delegated = m["artifact"]["export"]["delegated_subgraphs"]["model"]
        # fp32: the rewritten graphs are one XNNPACK delegate; w8a8_dynamic: 5 consecutive XNNPACK delegates
        # (docs/targets.md)
        assert delegated == (1 if scheme == "fp32" else 5), (a["id"], delegated)
        assert (published / a["id"] / "model.pte").exists() == (a["status"] == "pass")
        if a["status"] == "blocked":   # refused: on the blocked shelf with its reasons, never published
            assert a["location"].startswith("blocked/") and a["reasons"]

    for comp in COMPONENTS:
        fp32 = arts[(comp, "executorch", "fp32")]
        assert fp32["status"] == "pass", (fp32["id"], fp32["reasons"])
        assert min(o["snr_db"] for o in fp32["parity"]["outputs"].values()) >= 90
        if fp32["parity"].get("lm"):
            assert fp32["parity"]["lm"]["top1_agreement"] == 1.0
        if comp in SHORT:
            dyn = arts[(comp, "executorch", "w8a8_dynamic")]
            key = "logits" if comp in COMPONENTS[:2] else "audio"
            assert dyn["parity"]["outputs"][key]["snr_db"] < 60   # really quantized: int8, not fp32 under another name
            assert dyn["size_bytes"] < fp32["size_bytes"]

    for comp in SHORT:
        a = arts[(comp, "coreml", "fp16")]
        assert (store / a["location"] / "model.mlpackage" / "Manifest.json").exists()
        assert not (published / a["id"]).exists() or sys.platform == "darwin"
        if sys.platform != "darwin":   # no CoreML runtime here: unverified with the reason, never published as passing
            assert a["status"] == "unverified" and a["runtime"] is None and "needs macOS" in a["reasons"][0]
            assert a["location"].startswith("unverified/")

    e2e = rep["end_to_end"]   # the fp32 .pte files, chained through the host loops, give the fp32 codes and audio
    assert all(x == 1.0 for x in e2e["codes"]["executorch/fp32"]["teacher_forced_code_agreement"])
    assert e2e["audio"]["executorch/fp32"]["waveform_snr_db"] >= 90


@pytest.mark.macos
@pytest.mark.skipif(sys.platform != "darwin", reason="CoreML prediction needs macOS")
def test_qwen3_tts_coreml_is_gated_on_macos(tmp_path):
    d = yaml.safe_load(_short_recipe(tmp_path).read_text())
    d["builds"] = [b for b in d["builds"] if b["target"] == "coreml"]
    p = tmp_path / "coreml_only.yaml"
    p.write_text(yaml.safe_dump(d, allow_unicode=True))
    store = tmp_path / "store"
    main(["recipe", str(p), "--store", str(store)])
    rep = json.loads((store / "runs" / NAME / "latest.json").read_text())
    assert {a["id"].split(".")[0] for a in rep["artifacts"]} == set(SHORT)
    for a in rep["artifacts"]:   # executed by MLModel.predict and gated on the figures, never unverified on macOS
        assert a["runtime"].startswith("coreml") and a["parity"] is not None and a["checks"]
        assert a["status"] == ("pass" if all(c["ok"] for c in a["checks"]) else "blocked"), a["id"]
        assert (store / "published" / NAME / a["id"]).exists() == (a["status"] == "pass")
