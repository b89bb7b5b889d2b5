"""Qwen3-TTS components: the host loop reproduces the fp32 pipeline, and exported fp32 ONNX graphs match it."""
import numpy as np
import pytest

from omni_export.components.base import PromptSet
from omni_export.families import load_prompt_set
from omni_export.exporters import get_target
from omni_export.exporters.onnx import TARGET as ONNX
from omni_export.families import build_model
from omni_export.parity.metrics import compare

OPTS = {"max_prompt_tokens": 12, "new_tokens": 5}


@pytest.fixture(scope="module")
def bundle():
    return build_model("qwen3_tts", "tiny", seed=0)


def test_prompt_sets_are_disjoint_and_multilingual():
    cal, par = load_prompt_set("qwen3_tts_calibration"), load_prompt_set("qwen3_tts_parity")
    assert not set(cal.prompts) & set(par.prompts)
    assert any(ord(ch) > 0x3000 for p in par.prompts for ch in p)


@pytest.mark.parametrize("name", ["talker_step", "code_predictor_step", "code_predictor_window", "code2wav_first"])
def test_onnx_fp32_matches_reference(bundle, name, tmp_path):
    comp = bundle.family.components[name](bundle, context=16)
    ref = comp.reference(PromptSet("t", ("Hi there.",)), OPTS)
    from omni_export.exporters import ExportRequest
    from omni_export.schemes import get_scheme
    built = ONNX.export(ExportRequest(comp, get_scheme("fp32"), None, None, None), tmp_path)
    run = ONNX.execution(built, comp, None).run
    rep = compare(ref, comp.trace(run, ref, 48), comp.kind == "lm", audio=comp.kind == "audio")
    assert min(o["snr_db"] for o in rep["outputs"].values()) >= 90.0
    if comp.kind == "lm":
        assert rep["lm"]["top1_agreement"] == 1.0
    else:
        assert rep["audio"]["log_mel_distance"] < 0.01
        # the audio reference is the fp64 decode; the eager fp32 stream's own distance from it is reported beside
        audio = rep["outputs"]["audio"]
        assert audio["eager_fp32_snr_db"] >= 90.0 and audio["snr_db"] >= audio["eager_fp32_snr_db"] - 30.0
        assert ref[0].outputs["audio"].dtype == np.float64
