"""The released MiniCPM-o directory layout (config.json with tts_config, sharded safetensors whose tts.* keys are the
speech path, assets/token2wav/flow.pt + hift.pt) loads through ``build_model`` with the sizes read from it, gives
the seeded model's function exactly, and every field or file it cannot honour is a one-line error."""
import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from omni_export.errors import CheckpointError
from omni_export.families import build_model
from omni_export.families.minicpmo.checkpoint import official_state
from omni_export.families.minicpmo.config import PRESETS
from omni_export.families.minicpmo.graphs import eager
from omni_export.families.minicpmo.model import MiniCPMOSpeech, init_random
from omni_export.families.minicpmo.vocoder import DiTStepComponent, FlowEncoderComponent

TTS_CONFIG = {  # sizes of the tiny preset; the other fields as MiniCPMTTSConfig serializes them
    "model_type": "minicpmtts", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
    "num_hidden_layers": 2, "num_key_value_heads": 4, "max_position_embeddings": 4096, "num_audio_tokens": 6562,
    "num_text_tokens": 512, "llm_dim": 64, "num_vq": 1, "hidden_act": "silu", "projector_type": "mlp",
    "condition_type": "hidden_text_merge", "backbone_model": "llama", "normalize_projected_hidden": True,
    "audio_bos_token_id": 151687, "text_eos_token_id": 151692, "audio_tokenizer_type": "s3tokenizer_step_audio",
    "audio_tokenizer_sample_rate": 24000, "s3_stream_chunk_size": 25, "s3_stream_n_timesteps": 10,
    "s3_stream_prelook_size": 3, "streaming": True, "attention_type": "sliding_recompute", "window_size": 2,
    "aug_loss_weight": False, "num_mel_bins": 100, "top_p": 0.85}


@pytest.fixture(scope="module")
def seeded():
    return init_random(MiniCPMOSpeech(PRESETS["tiny"]), 0).eval()


def write_release(model, d, tts_config=None, hift_name="hift.pt", other_key="llm.embed_tokens.weight"):
    """The release's layout: two indexed shards (the tts.* keys beside another module's), the token2wav state dicts."""
    off = official_state(model)
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "minicpmo", "hidden_size": 64,
                                               "tts_config": tts_config or TTS_CONFIG}))
    shards = {"model-00001-of-00002.safetensors": {other_key: torch.zeros(8, 4)},
              "model-00002-of-00002.safetensors": {k: v.contiguous() for k, v in off["tts"].items()}}
    for name, tensors in shards.items():
        save_file(tensors, str(d / name))
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: name for name, tensors in shards.items() for k in tensors}}))
    (d / "assets" / "token2wav").mkdir(parents=True)
    torch.save(off["flow"], d / "assets" / "token2wav" / "flow.pt")
    torch.save({f"generator.{k}": v for k, v in off["hift"].items()}, d / "assets" / "token2wav" / hift_name)
    return d


def test_release_directory_loads_as_the_seeded_model(seeded, tmp_path):
    b = build_model("minicpmo", checkpoint=write_release(seeded, tmp_path / "MiniCPM-o-4_5"))
    cfg, ref = b.config, PRESETS["tiny"]
    assert (cfg.tts, cfg.dit, cfg.hift, cfg.text_vocab_size, cfg.llm_hidden) == \
        (ref.tts, ref.dit, ref.hift, ref.text_vocab_size, ref.llm_hidden)
    assert cfg.encoder == ref.encoder.__class__(**{**ref.encoder.__dict__, "pe_rows": 5000})  # a buffer: released size
    got, want = b.module.state_dict(), seeded.state_dict()
    assert got.keys() == want.keys()
    worst = max(float((got[k] - want[k]).abs().max()) for k in want)
    assert worst < 1e-6, worst  # weight norm folded back: g * v / |v| with g = |v|
    # the function (head counts carry no shape of their own): the encoder chunk and the DiT step on the same feeds
    seeded_bundle = build_model("minicpmo", "tiny", seed=0)
    for C in (FlowEncoderComponent, DiTStepComponent):
        ours, ref_c = C(b, context=64), C(seeded_bundle, context=64)
        feeds = []
        ref_c.run("hello there", {"max_prompt_tokens": 16, "new_tokens": 8}, eager(ref_c.graph),
                  record=lambda f: feeds.append(f))
        for x, y in zip(eager(ours.graph)(feeds[-1]), eager(ref_c.graph)(feeds[-1])):
            assert np.abs(x - y).max() <= 1e-5 * max(1.0, float(np.abs(y).max())), C.name


@pytest.mark.parametrize("field, value, says", [
    ("hidden_act", "gelu", "tts_config hidden_act='gelu' is not implemented by the minicpmo family"),
    ("num_vq", 4, "tts_config num_vq=4 is not implemented"),
    ("audio_tokenizer_type", "s3tokenizer", "tts_config audio_tokenizer_type='s3tokenizer' is not implemented"),
    ("s3_stream_n_timesteps", 5, "tts_config s3_stream_n_timesteps=5 is not implemented"),
    ("use_flash_decoder", True, "tts_config field use_flash_decoder=True is not implemented"),
])
def test_fields_it_does_not_implement_are_refused(seeded, tmp_path, field, value, says):
    d = write_release(seeded, tmp_path / "ckpt", {**TTS_CONFIG, field: value})
    with pytest.raises(CheckpointError, match=says):
        build_model("minicpmo", checkpoint=d)


def test_missing_or_foreign_files_are_refused(seeded, tmp_path):
    d = write_release(seeded, tmp_path / "a", hift_name="hift_causal.pt")
    with pytest.raises(CheckpointError, match=r"assets/token2wav/hift.pt is missing"):
        build_model("minicpmo", checkpoint=d)
    d = write_release(seeded, tmp_path / "b")
    hift = torch.load(d / "assets" / "token2wav" / "hift.pt", weights_only=True)
    hift["generator.causal_pad.weight"] = torch.zeros(1)  # a layer the original HiFT does not have
    torch.save(hift, d / "assets" / "token2wav" / "hift.pt")
    with pytest.raises(CheckpointError, match="hift checkpoint: unexpected keys: causal_pad.weight"):
        build_model("minicpmo", checkpoint=d)
    d = write_release(seeded, tmp_path / "c", {k: v for k, v in TTS_CONFIG.items() if k != "llm_dim"})
    with pytest.raises(CheckpointError, match="tts_config lacks llm_dim"):
        build_model("minicpmo", checkpoint=d)
    d = write_release(seeded, tmp_path / "e", other_key="speaker_encoder.proj.weight")
    with pytest.raises(CheckpointError, match="key speaker_encoder.proj.weight belongs to no module of MiniCPM-o"):
        build_model("minicpmo", checkpoint=d)
    # a field left out means MiniCPMTTSConfig's default, which for these is not what the graphs compute
    d = write_release(seeded, tmp_path / "d", {k: v for k, v in TTS_CONFIG.items() if k != "normalize_projected_hidden"})
    with pytest.raises(CheckpointError, match="lacks normalize_projected_hidden .*default False is not implemented"):
        build_model("minicpmo", checkpoint=d)


def test_the_released_sizes_are_read_from_the_weights_shapes():
    """At the real sizes (meta tensors: shapes only) the flow and HiFT configs read from the weights are preset 4.5's."""
    from omni_export.families.minicpmo.official import flow_configs, hift_config
    with torch.device("meta"):
        off = official_state(MiniCPMOSpeech(PRESETS["4.5"]))
    assert flow_configs(off["flow"], "4.5") == (PRESETS["4.5"].encoder, PRESETS["4.5"].dit)
    assert hift_config(off["hift"], "4.5") == PRESETS["4.5"].hift
