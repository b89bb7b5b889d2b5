"""The Spark-X2.5 definition: config round trip, presets, and the cached decode loop's fidelity."""
import numpy as np
import pytest

from omni_export.components.decoder_lm import reference_logits
from omni_export.families.spark.model import FULL, PRESETS, SLIDING, SparkConfig
from omni_export.parity.metrics import log_softmax


def test_layer_types_are_3_sliding_to_1_full():
    cfg = PRESETS["full"]
    assert cfg.layer_types[:8] == (SLIDING, SLIDING, SLIDING, FULL) * 2
    assert cfg.rotary_dim(FULL) == 64 and cfg.rotary_dim(SLIDING) == 256
    assert cfg.rope_theta(FULL) == 5_000_000 and cfg.rope_theta(SLIDING) == 10_000


def test_hf_config_round_trip():
    for cfg in PRESETS.values():
        assert SparkConfig.from_hf(cfg.to_hf()) == cfg


def test_hf_config_rejects_other_model_type():
    from omni_export.errors import CheckpointError
    with pytest.raises(CheckpointError, match="model_type='llama' is not 'spark2_5'"):
        SparkConfig.from_hf({"model_type": "llama"})


def test_tiny_preset_has_a_full_layer_and_a_window_the_default_run_crosses():
    from omni_export.recipes import load_recipe
    cfg, r = PRESETS["tiny"], load_recipe("spark_w8a16")
    assert FULL in cfg.layer_types and SLIDING in cfg.layer_types
    assert r.prompts.max_prompt_tokens + r.parity.new_tokens > cfg.sliding_window


def _cached_vs_recompute(bundle, context, n_prompt, n_new):
    from omni_export.components.decoder_lm import DecodeStepComponent
    comp = DecodeStepComponent(bundle, context)
    prompt = list(np.random.RandomState(3).randint(3, bundle.config.vocab_size, n_prompt))
    outs, gen = comp.run_tokens(comp.eager_runner(), prompt, n_new=n_new)
    seq = prompt + gen[:-1]
    ref = reference_logits(bundle.module, seq)
    cached = outs["logits"].reshape(len(seq), -1)
    ref_greedy = ref[n_prompt - 1:].argmax(-1)
    return cached, ref, gen, ref_greedy


def test_cached_loop_matches_recompute_reference_across_the_window(tiny_spark):
    """Ring-buffer sliding caches + full caches vs full recomputation every step: 32/32 greedy, logprob <= 1e-4."""
    cached, ref, gen, ref_greedy = _cached_vs_recompute(tiny_spark, 128, 16, 32)
    assert len(cached) > 2 * tiny_spark.config.sliding_window  # the window is crossed more than once
    assert list(ref_greedy) == gen
    assert np.max(np.abs(log_softmax(cached) - log_softmax(ref))) <= 1e-4


def test_cached_loop_at_long_context_reduced_config():
    """A reduced config at context 1024 with the sliding window crossed many times."""
    from omni_export.families import build_model
    import dataclasses
    from omni_export.families import spark
    cfg = dataclasses.replace(spark.PRESETS["tiny"], hidden_size=64, intermediate_size=128, head_dim=16,
                              sliding_window=64, max_position_embeddings=2048, vocab_size=512)
    spark.PRESETS["_reduced_test"] = cfg
    try:
        b = build_model("spark", "_reduced_test", seed=1)
    finally:
        del spark.PRESETS["_reduced_test"]
    cached, ref, gen, ref_greedy = _cached_vs_recompute(b, 1024, 990, 32)
    assert list(ref_greedy) == gen
    assert np.max(np.abs(log_softmax(cached) - log_softmax(ref))) <= 1e-4
