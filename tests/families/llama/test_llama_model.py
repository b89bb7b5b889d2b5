"""The llama family's fp32 model: cached decode == full-sequence reference, variants, config fields, rope scaling."""
import dataclasses
import math

import numpy as np
import pytest
import torch

from omni_export.errors import CheckpointError
from omni_export.families.llama import PRESETS, LlamaConfig, LlamaForCausalLM, RopeScaling
from omni_export.families.llama.model import init_random
from omni_export.blocks.layers import rope_table

TINY = PRESETS["tiny"]
VARIANTS = {
    "llama": TINY,
    "qwen2": dataclasses.replace(TINY, model_type="qwen2", tie_word_embeddings=False),
    "qwen3": dataclasses.replace(TINY, model_type="qwen3", attention_bias=True, head_dim=96),
    "llama3-rope": dataclasses.replace(TINY, rope_theta=500000.0, rope_scaling=RopeScaling(
        "llama3", 8.0, 1.0, 4.0, 64)),
}


def cached_loop(lm, tokens, context):
    """Token by token through the DecoderLM protocol: static caches of ``context`` rows, new rows written back."""
    cfg = lm.config
    cos, sin = rope_table(cfg.inv_freq("full_attention"), np.arange(context))
    caches = [[torch.zeros(1, cfg.num_key_value_heads, context, cfg.head_dim) for _ in range(2)] for _ in lm.model.layers]
    out = []
    with torch.no_grad():
        for pos, t in enumerate(tokens):
            x = lm.input_embedding()(torch.tensor([[t]]))
            mask = torch.full((1, 1, 1, context + 1), -100.0)
            mask[..., :pos] = 0.0
            mask[..., -1] = 0.0
            c, s = (torch.from_numpy(a[pos])[None, None, None] for a in (cos, sin))
            for layer, (kc, vc) in zip(lm.model.layers, caches):
                assert layer.layer_type == "full_attention"
                x, k, v = layer(x, c, s, mask, kc, vc)
                kc[:, :, pos], vc[:, :, pos] = k[:, :, 0], v[:, :, 0]
            out.append(lm.lm_head(lm.model.norm(x))[0, 0])
    return torch.stack(out)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_cached_decode_matches_full_sequence(variant):
    lm = init_random(LlamaForCausalLM(VARIANTS[variant]), seed=0).eval()
    tokens = torch.randint(0, TINY.vocab_size, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    full = lm(torch.tensor([tokens]))[0]
    step = cached_loop(lm, tokens, context=48)
    err = (step - full).abs().max().item() / full.abs().max().item()
    assert err < 2e-6, err
    assert (step.argmax(-1) == full.argmax(-1)).all()
    assert full.std() > 0.5  # not a degenerate (constant) function


def test_variant_parameters_follow_hf_layout():
    keys = {v: LlamaForCausalLM(c).expected_keys() for v, c in VARIANTS.items()}
    a = "model.layers.0.self_attn."
    assert set(keys["llama"]) == {"model.embed_tokens.weight", "model.norm.weight"} | {
        f"model.layers.{i}.{n}.weight" for i in range(4) for n in (
            "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
            "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm")}
    assert {f"{a}{p}_proj.bias" for p in "qkv"} <= set(keys["qwen2"]) and f"{a}o_proj.bias" not in keys["qwen2"]
    assert keys["qwen2"]["lm_head.weight"] == (4096, 256)  # untied head
    assert keys["qwen3"][f"{a}q_norm.weight"] == (96,) and keys["qwen3"][f"{a}q_proj.weight"] == (384, 256)
    assert keys["qwen3"][f"{a}o_proj.bias"] == (256,)


def test_config_round_trip_and_presets():
    for cfg in list(VARIANTS.values()) + list(PRESETS.values()):
        assert LlamaConfig.from_hf(cfg.to_hf()) == cfg
    s = PRESETS["smollm2-135m"]
    n = sum(p.numel() for p in LlamaForCausalLM(s).parameters())
    assert 134_000_000 < n < 135_000_000  # SmolLM2-135M: 134.5 M parameters with the tied head
    assert s.layer_types == ("full_attention",) * 30 and s.rotary_dim("full_attention") == 64


SMOLLM2_CONFIG = {  # SmolLM2-135M-Instruct's config.json
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "head_dim": 64, "hidden_act": "silu", "hidden_size": 576, "initializer_range": 0.041666666666666664,
    "intermediate_size": 1536, "is_llama_config": True, "max_position_embeddings": 8192, "mlp_bias": False,
    "model_type": "llama", "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3,
    "pad_token_id": 2, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_interleaved": False, "rope_scaling": None,
    "rope_theta": 100000, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.42.3",
    "transformers.js_config": {"kv_cache_dtype": {"q4f16": "float16", "fp16": "float16"}}, "use_cache": True,
    "vocab_size": 49152}

QWEN3_CONFIG = {  # Qwen3-0.6B's config.json (head_dim 128 != hidden / heads)
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024, "initializer_range": 0.02,
    "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False,
    "vocab_size": 151936}


def test_released_configs_load():
    assert LlamaConfig.from_hf(SMOLLM2_CONFIG) == PRESETS["smollm2-135m"]
    q = LlamaConfig.from_hf(QWEN3_CONFIG)
    assert (q.head_dim, q.qk_norm, q.qkv_bias, q.o_bias, q.rope_theta) == (128, True, False, False, 1e6)
    q2 = LlamaConfig.from_hf({k: v for k, v in QWEN3_CONFIG.items() if k not in ("attention_bias", "head_dim")}
                             | {"model_type": "qwen2", "sliding_window": 32768})
    assert (q2.qkv_bias, q2.o_bias, q2.qk_norm, q2.head_dim) == (True, False, False, 64)


@pytest.mark.parametrize("field,value,words", [
    ("hidden_act", "gelu_pytorch_tanh", "hidden_act='gelu_pytorch_tanh'"),
    ("use_sliding_window", True, "use_sliding_window=True"),
    ("mlp_bias", True, "mlp_bias=True"),
    ("rope_interleaved", True, "rope_interleaved=True"),
    ("rope_scaling", {"rope_type": "dynamic", "factor": 2.0}, "rope_scaling.rope_type='dynamic'"),
    ("rope_scaling", {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, "'yarn'"),
    ("rope_scaling", {"rope_type": "linear", "factor": 2.0, "beta": 1}, "rope_scaling.beta=1"),
    ("rope_scaling", {"rope_type": "llama3", "factor": 8.0}, "rope_scaling.high_freq_factor=None is required"),
    ("layer_types", ["full_attention"] * 29 + ["sliding_attention"], "layer_types=["),
    ("sliding_window", 4096, "sliding_window=4096"),
    ("hidden_size", 576.0, "hidden_size=576.0 must be a positive integer"),
    ("head_dim", 63, "head_dim=63 must be even"),
    ("num_key_value_heads", 4, "num_key_value_heads=4 does not divide num_attention_heads 9"),
    ("partial_rotary_factor", 0.5, "partial_rotary_factor=0.5"),
    ("model_type", "mistral", "model_type='mistral'"),
    ("tie_word_embeddings", "yes", "tie_word_embeddings='yes'"),
    ("quantization_config", {"quant_method": "gptq"}, "quantization_config="),
    ("auto_map", {"AutoModel": "x.Y"}, "auto_map="),
])
def test_unimplemented_config_field_is_one_line_error(field, value, words):
    with pytest.raises(CheckpointError) as e:
        LlamaConfig.from_hf({**SMOLLM2_CONFIG, field: value})
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"config.json {field.split('.')[0]}") and words in msg, msg


def test_transformers_5_rope_parameters():
    base = {k: v for k, v in SMOLLM2_CONFIG.items() if k != "rope_theta"}
    cfg = LlamaConfig.from_hf({**base, "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e5}})
    assert cfg.rope_theta == 1e5 and cfg.rope_scaling == RopeScaling("linear", 2.0)
    with pytest.raises(CheckpointError, match=r"^config.json rope_parameters.rope_theta=5.0 differs from rope_theta"):
        LlamaConfig.from_hf({**SMOLLM2_CONFIG, "rope_parameters": {"rope_type": "default", "rope_theta": 5.0}})


def test_layer_count_and_attention_bias_checks():
    with pytest.raises(CheckpointError, match="layer_types="):
        LlamaConfig.from_hf({**SMOLLM2_CONFIG, "layer_types": ["full_attention"] * 29 + ["sliding_attention"]})
    with pytest.raises(CheckpointError, match="^config.json layer_types='29 entries' does not match num_hidden_layers 30$"):
        LlamaConfig.from_hf({**SMOLLM2_CONFIG, "layer_types": ["full_attention"] * 29})
    with pytest.raises(CheckpointError, match="attention_bias=True is not a qwen2 field"):
        LlamaConfig.from_hf({**SMOLLM2_CONFIG, "model_type": "qwen2", "attention_bias": True})
    with pytest.raises(CheckpointError, match="hidden_size=None is required"):
        LlamaConfig.from_hf({k: v for k, v in SMOLLM2_CONFIG.items() if k != "hidden_size"})


def test_rope_scaling_inverse_frequencies():
    base = dataclasses.replace(TINY, rope_theta=500000.0).inv_freq("full_attention")
    lin = dataclasses.replace(TINY, rope_scaling=RopeScaling("linear", 4.0))
    assert np.allclose(lin.inv_freq("full_attention"), TINY.inv_freq("full_attention") / 4.0, rtol=0, atol=0)
    # Llama 3.1's values: factor 8, low 1, high 4, original context 8192
    l3 = LlamaConfig.from_hf({**SMOLLM2_CONFIG, "rope_theta": 500000.0, "head_dim": 64, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}}).inv_freq("full_attention")
    wl = 2 * math.pi / base
    assert l3.dtype == np.float64 and l3.shape == (32,)
    assert np.array_equal(l3[wl < 8192 / 4], base[wl < 8192 / 4])          # short wavelengths kept
    assert np.allclose(l3[wl > 8192], base[wl > 8192] / 8.0, rtol=1e-15)    # long ones slowed 8x
    mid = (wl >= 2048) & (wl <= 8192)
    assert mid.any() and np.all(l3[mid] < base[mid]) and np.all(l3[mid] > base[mid] / 8.0)
