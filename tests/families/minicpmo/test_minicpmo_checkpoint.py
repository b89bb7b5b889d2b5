"""MiniCPM-o official key layouts: tts.-prefixed head with weight-normed head_code, flow.pt names, HiFT with its
weight-norm pairs; folded on load, round trip exact, bad files one-line errors."""
import pytest
import torch

from omni_export.errors import CheckpointError
from omni_export.families.minicpmo.checkpoint import G, V, official_state, split_state
from omni_export.families.minicpmo.config import PRESETS
from omni_export.families.minicpmo.model import MiniCPMOSpeech, init_random


@pytest.fixture(scope="module")
def model():
    return init_random(MiniCPMOSpeech(PRESETS["tiny"]), 0).eval()


def test_official_layouts(model):
    off = official_state(model)
    tts, flow, hift = off["tts"], off["flow"], off["hift"]
    assert tts["tts.head_code.0" + G].shape == (6562, 1) and tts["tts.head_code.0" + V].shape == (6562, 64)
    assert "tts.emb_code.0.weight" in tts and "tts.model.embed_tokens.weight" in tts
    for k in ("decoder.estimator.blocks.1.adaLN_modulation.1.weight", "decoder.estimator.blocks.0.conv.block.6.weight",
              "decoder.estimator.blocks.0.attn.q_norm.bias", "encoder.encoders.1.self_attn.pos_bias_u",
              "encoder.up_layer.conv.weight", "encoder.pre_lookahead_layer.conv1.weight", "input_embedding.weight",
              "spk_embed_affine_layer.weight", "encoder_proj.bias", "encoder.embed.out.1.weight"):
        assert k in flow, k
    assert flow["decoder.estimator.blocks.0.adaLN_modulation.1.weight"].shape == (9 * 64, 64)
    assert hift["ups.0" + G].shape == (32, 1, 1) and hift["f0_predictor.condnet.8" + G].shape == (32, 1, 1)
    assert "source_downs.0.weight" in hift and "m_source.l_linear.weight" in hift


def test_round_trip_folds_weight_norm(model):
    off = official_state(model)
    off["tts"]["tts.head_code.0" + G] *= 2.0                       # g scales each row; v's norm does not matter
    off["tts"]["tts.head_code.0" + V] *= 3.0
    off["tts"]["tts.projector_spk.linear1.weight"] = torch.zeros(2, 2)   # shipped, unused at inference
    state = split_state(model, off)
    ref = model.state_dict()
    assert torch.allclose(state["tts.head_code.0.weight"], 2.0 * ref["tts.head_code.0.weight"], atol=1e-6)
    assert all(torch.allclose(state[k], ref[k], atol=1e-6) for k in ref if k != "tts.head_code.0.weight")


def test_bad_checkpoints_are_one_line_errors(model):
    off = official_state(model)
    del off["hift"]["conv_post" + V]
    with pytest.raises(CheckpointError, match=r"hift checkpoint: missing key conv_post.parametrizations"):
        split_state(model, off)
    off = official_state(model)
    off["flow"]["encoder_proj.weight"] = torch.zeros(3, 3)
    with pytest.raises(CheckpointError, match=r"key encoder_proj.weight has shape \(3, 3\)"):
        split_state(model, off)
    off = official_state(model)
    off["flow"]["decoder.extra"] = torch.zeros(1)
    with pytest.raises(CheckpointError, match="unexpected keys: decoder.extra"):
        split_state(model, off)
