"""Calibrated w8a16 Code2Wav (1-frame chunk graph) on ORT CPU: clears its gate bar with the component's quantization
policy, the fp32 graph is unchanged, and the per-stage breakdown reads every stage of both real graphs. The graphs
are the ``qwen3_tts_w8a16`` recipe test's own builds (``qwen3_small``: same model, calibration and policy), read
from its shared store, not built a second time."""
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from qwen3_small import small_recipe

from omni_export.calibration import sensitivity
from omni_export.components.base import PromptSet
from omni_export.exporters import shelved
from omni_export.exporters.base import Built
from omni_export.exporters.onnx import TARGET as ONNX
from omni_export.exporters.qdq_onnx import TARGET as QDQ
from omni_export.exporters.qdq_onnx import qdq_source
from omni_export.families import build_model, load_prompt_set
from omni_export.parity.metrics import compare
from omni_export.schemes import get_scheme

pytestmark = pytest.mark.slow  # reads the qwen3_tts_w8a16 recipe test's store (tests/xdist_units.py: one unit)

OPTS = {"max_prompt_tokens": 16, "new_tokens": 8}
BAR_DB = 20.0      # recipe qwen3_tts_w8a16: code2wav_first/w8a16 audio snr_db min (not restated elsewhere)
FP32_DB = 90.0     # tiny: fp32 reaches 97-119 dB of the fp64 decode (the recipe's bar, 80 dB, is set for the real size)


def _shelved(store: Path, target: str, scheme: str) -> Built:
    """Code2Wav's first-chunk build of ``target``/``scheme`` published in the store, as its manifest records it."""
    d = store / "published" / "qwen3_tts_w8a16" / f"code2wav_first.{scheme}.{target}"
    return shelved(SimpleNamespace(shelf_dir=d, target=target, scheme=scheme))  # an ArtifactResult's fields it reads


@pytest.fixture(scope="module")
def built(shared_store, tmp_path_factory):
    shared = shared_store(small_recipe("qwen3_tts_w8a16", tmp_path_factory))
    bundle = build_model("qwen3_tts", "tiny", seed=0)   # the recipe's model
    comp = bundle.family.components["code2wav_first"](bundle, context=64)
    par = PromptSet("t", (load_prompt_set("qwen3_tts_parity").prompts[0],))
    ref = comp.reference(par, OPTS)
    fp32, qdq = _shelved(shared.path, "onnx", "fp32"), _shelved(shared.path, "qdq_onnx", "w8a16")
    feeds = list(comp.calibration_feeds(par, OPTS))  # the parity chunks' inputs, as the fp32 stream feeds them
    return comp, ref, fp32, qdq, feeds, tmp_path_factory.mktemp("c2w")


def _audio(comp, ref, target, b):
    rep = compare(ref, comp.trace(target.execution(b, comp, None).run, ref, None), False, audio=True)
    return rep["outputs"]["audio"]["snr_db"], rep["audio"]["log_mel_distance"]


def test_w8a16_clears_the_bar_and_fp32_is_unchanged(built):
    comp, ref, fp32, qdq, _, _ = built
    snr32, _ = _audio(comp, ref, ONNX, fp32)
    assert snr32 >= FP32_DB
    snr, mel = _audio(comp, ref, QDQ, qdq)
    # before the policy this graph measured 14 dB here (clipped pre-conv ranges, int8 waveform-path weights)
    assert snr >= BAR_DB, snr
    assert mel <= 6.0
    pol = qdq.info["component_policy"]["model"]
    assert pol["activation_range_margin"] == 2.0
    # the waveform-path convs as int8 hi/lo pairs (none left at int16), the residual branches untouched
    assert "dec.decoder.0.conv" in pol["int8_hi_lo"] and not pol.get("int16_weights")
    assert not any("pre_transformer.layers" in w or "upsample.0.1" in w for w in pol["int8_hi_lo"])


def test_stage_breakdown_reads_every_stage(built):
    comp, _, _, qdq, feeds, work = built
    g = comp.graphs()[0]   # the fp32 graph the QDQ graph was quantized from (1x1-conv projections, hi/lo pairs)
    src = work / "src.onnx"
    qdq_source(comp, g, get_scheme("w8a16"), src)
    rows = sensitivity.stage_snr(src, qdq.path("model"), feeds, comp.stages(), "audio")
    assert [r["stage"] for r in rows] == [s for s, _ in comp.stages()]
    assert rows[-1]["tensor"] == "audio" and len({r["tensor"] for r in rows}) == len(rows)
    # each stage's output is quantized (below fp32 agreement) but faithful (well above the waveform bar)
    assert all(BAR_DB < r["snr_db"] < 100 for r in rows), rows
    assert np.isfinite([r["snr_db"] for r in rows]).all()


def test_policy_is_only_for_the_w8a16_family(built):
    """int8 hi/lo waveform-path pairs for every int8-weight / 16-bit-activation build (so calibrated and uncalibrated
    differ only in their ranges); the widened ranges only for calibrated min-max; nothing for other schemes."""
    comp = built[0]
    g = comp.graphs()[0]
    for name in ("w8a8", "w8a16_mixed", "w4a16", "w4a16_uncalibrated", "fp16"):
        s = get_scheme(name)
        assert comp.graph_for("qdq_onnx", g, s) is None  # no form of its own: the fp32 export, rewritten
        assert comp.qdq_policy("model", g.module, s) is None
    cal = comp.qdq_policy("model", comp.graph_for("qdq_onnx", g, get_scheme("w8a16")), get_scheme("w8a16"))
    assert cal.why["int8_hi_lo"] and not cal.int16_weights
    for name in ("w8a16_uncalibrated", "w8a16_percentile"):
        p = comp.qdq_policy("model", comp.graph_for("qdq_onnx", g, get_scheme(name)), get_scheme(name))
        assert p.why["int8_hi_lo"] == cal.why["int8_hi_lo"] and p.range_margin == 1.0 < cal.range_margin
