"""MiniCPM-o Token2wav components: reference (exact fp64 whole-utterance decode) vs the eager fp32 stream and vs
the ORT CPU stream of the exported graph, through the project's parity metrics; calibration feeds are real."""
from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest

from omni_export.components.base import PromptSet
from omni_export.lowering.onnx_export import export_onnx
from omni_export.families.minicpmo.config import PRESETS
from omni_export.families.minicpmo.model import MiniCPMOSpeech, init_random
from omni_export.families.minicpmo.vocoder import COMPONENTS, SILENCE_TOKEN, speech_host
from omni_export.parity.metrics import compare

OPTS = {"max_prompt_tokens": 12, "new_tokens": 40}     # 3 silence + 40 codes: two chunks, the last one short
PROMPTS = PromptSet.from_text("t", "Hello there.\nGood morning.\n")


@pytest.fixture(scope="module")
def bundle():
    m = init_random(MiniCPMOSpeech(PRESETS["tiny"]), 0).eval()
    return SimpleNamespace(module=m, config=PRESETS["tiny"], source="seeded", weights_hash="h")


def test_utterance_tokens_start_with_silence(bundle):
    toks = speech_host(bundle, 64).tokens("Hello there.", 12, 40)
    assert toks[:3].tolist() == [SILENCE_TOKEN] * 3 and 3 < len(toks) <= 43 and toks.max() < 6561


@pytest.mark.parametrize("name,signal", [("flow_encoder", "mu_utterance"), ("dit_step", "mel"),
                                         ("hift", "audio")])
def test_stage_eager_stream_meets_exact_reference(bundle, name, signal):
    comp = COMPONENTS[name](bundle, context=64)
    ref = comp.reference(PROMPTS, OPTS)
    res = compare(ref, comp.trace(comp.eager_runner(), ref, None), lm=False, audio=signal == "audio")
    out = res["outputs"]
    assert out[signal]["snr_db"] > 105.0 and out[signal]["eager_fp32_snr_db"] > 105.0, out[signal]
    for spec in comp.output_specs():            # per-call outputs: the same eager graph on the same feeds
        assert spec.name != signal and (out[spec.name]["snr_db"] > 200.0 or out[spec.name]["max_abs_err"] == 0.0)
    feeds = list(comp.calibration_feeds(PROMPTS, OPTS))
    assert len(feeds) == comp.calibration_steps(PROMPTS, OPTS) > 0
    assert {k: v.shape for k, v in feeds[0].items()} == {s.name: s.shape for s in comp.input_specs()}


def test_dit_step_on_ort_meets_exact_reference(bundle, tmp_path):
    comp = COMPONENTS["dit_step"](bundle, context=64)
    ref = comp.reference(PROMPTS, OPTS)
    g = comp.graph
    sess = ort.InferenceSession(str(export_onnx(g.module, g, tmp_path / "dit.onnx")),
                                providers=["CPUExecutionProvider"])
    names = [s.name for s in g.outputs]
    res = compare(ref, comp.trace(lambda f: sess.run(names, f), ref, None), lm=False)
    assert res["outputs"]["mel"]["snr_db"] > 100.0, res["outputs"]["mel"]
    assert res["steps"] == 2 * 2 * 10 * 2       # 2 prompts x 2 chunks x 10 Euler steps x the CFG batch of 2 rows
