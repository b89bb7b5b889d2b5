"""GGUF files written with gguf.GGUFWriter: dequantized values equal gguf's own dequantize, the llama Q/K
permutation round trip is exact, names/config map to Hugging Face's, and unsupported input is one line."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

from ckpt_builders import FFN, HEAD_DIM, HEADS, HIDDEN, KV_HEADS, LAYERS, VOCAB, hf_shapes, random_weights, write_gguf
from omni_export.checkpoints import open_checkpoint
from omni_export.checkpoints.gguf import hf_name, llama3_rope_scaling, permute_qk, unpermute_qk
from omni_export.errors import CheckpointError

_TO_GGUF = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
            "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
            "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def gguf_name(key: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if key in top:
        return top[key]
    _, _, i, *rest = key.split(".")
    return f"blk.{i}.{_TO_GGUF['.'.join(rest[:-1])]}.{rest[-1]}"


def llama_gguf(path, weights: dict, kinds: dict, arch="llama", **kw):
    """HF-layout weights -> a GGUF as llama.cpp's converter writes it (Q/K rows permuted for llama)."""
    out = {}
    for k, w in weights.items():
        if arch == "llama" and (".q_proj." in k or ".k_proj." in k):
            w = permute_qk(w, HEADS if ".q_proj." in k else KV_HEADS)
        out[gguf_name(k)] = (w, kinds.get(k, "F32" if w.ndim == 1 else "Q8_0"))
    return write_gguf(path, out, arch=arch, **kw)


def _refused(path) -> str:
    with pytest.raises(CheckpointError) as e:
        open_checkpoint(path)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_q8_0_and_q4_1_equal_gguf_dequantize(tmp_path):
    w = random_weights(hf_shapes())
    kinds = {k: "Q4_1" for k in w if "mlp" in k} | {"model.embed_tokens.weight": "Q8_0",
                                                   "model.layers.0.self_attn.q_proj.weight": "Q4_1"}
    p = llama_gguf(tmp_path / "m.gguf", w, kinds)
    ck = open_checkpoint(p)
    assert ck.keys == {k: tuple(v.shape) for k, v in w.items()}
    assert "Q4_1+Q8_0 dequantized" in ck.source
    assert any(n.startswith("Q4_1 weights dequantized to fp32") for n in ck.notes)
    for k, v in w.items():
        kind = kinds.get(k, "F32" if v.ndim == 1 else "Q8_0")
        t = ck.tensor(k)
        assert t.dtype == torch.float32 and tuple(t.shape) == v.shape
        if kind == "F32":
            assert np.array_equal(t.numpy(), v)
            continue
        qt = getattr(T, kind)
        expect = gguf.quants.dequantize(gguf.quants.quantize(v, qt), qt)  # row quantization commutes with the row permutation
        assert np.array_equal(t.numpy(), expect), k
        err = np.abs(t.numpy() - v).max() / np.abs(v).max()
        assert 0 < err < (0.02 if kind == "Q8_0" else 0.2), (k, err)


def test_qk_permutation_round_trip_exact(tmp_path):
    rng = np.random.default_rng(3)
    q = rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32)
    assert not np.array_equal(permute_qk(q, HEADS), q)
    assert np.array_equal(unpermute_qk(permute_qk(q, HEADS), HEADS), q)
    w = random_weights(hf_shapes(bias=True))
    p = llama_gguf(tmp_path / "m.gguf", w, {k: "F32" for k in w})
    ck = open_checkpoint(p)
    assert ck.config["attention_bias"] is True
    for i in range(LAYERS):
        for proj in ("q_proj", "k_proj"):
            for kind in ("weight", "bias"):  # llama.cpp permutes llama's Q/K biases too
                k = f"model.layers.{i}.self_attn.{proj}.{kind}"
                assert np.array_equal(ck.tensor(k).numpy(), w[k]), k
    # a permuted row layout would be visible: the stored tensor is not the HF one
    raw = next(t for t in gguf.GGUFReader(str(p)).tensors if t.name == "blk.0.attn_q.weight")
    assert not np.array_equal(np.asarray(raw.data), w["model.layers.0.self_attn.q_proj.weight"])


def test_config_from_metadata_llama(tmp_path, trained_tokenizer):
    w = random_weights(hf_shapes(tied=False))
    p = llama_gguf(tmp_path / "m.gguf", w, {}, tokenizer=trained_tokenizer,
                   meta={"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0})
    ck = open_checkpoint(p)
    c = ck.config
    assert (c["model_type"], c["num_hidden_layers"], c["hidden_size"], c["intermediate_size"]) == ("llama", LAYERS, HIDDEN, FFN)
    assert (c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]) == (HEADS, KV_HEADS, HEAD_DIM)
    assert (c["rms_norm_eps"], c["rope_theta"], c["max_position_embeddings"]) == (1e-5, 100000.0, 256)
    assert c["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}
    assert c["vocab_size"] == VOCAB and c["tie_word_embeddings"] is False and c["attention_bias"] is False
    assert "lm_head.weight" in ck.keys
    assert ck.tokenizer is not None and ck.tokenizer.vocab_size == VOCAB


def test_qwen2_biases_and_qwen3_norms_map_without_permutation(tmp_path):
    w = random_weights(hf_shapes(bias=True))
    p = llama_gguf(tmp_path / "q2.gguf", w, {k: "F32" for k in w}, arch="qwen2")
    ck = open_checkpoint(p)
    assert ck.config["model_type"] == "qwen2" and "attention_bias" not in ck.config
    for k in ("model.layers.1.self_attn.q_proj.bias", "model.layers.1.self_attn.q_proj.weight"):
        assert np.array_equal(ck.tensor(k).numpy(), w[k])  # qwen2 GGUFs are not Q/K permuted
    w3 = random_weights(hf_shapes())
    out = {gguf_name(k): (v, "F32") for k, v in w3.items()}
    for i in range(LAYERS):
        out[f"blk.{i}.attn_q_norm.weight"] = (np.full(HEAD_DIM, 1.5, np.float32), "F32")
        out[f"blk.{i}.attn_k_norm.weight"] = (np.full(HEAD_DIM, 0.5, np.float32), "F32")
    ck3 = open_checkpoint(write_gguf(tmp_path / "q3.gguf", out, arch="qwen3", meta={"qwen3.attention.key_length": HEAD_DIM}))
    assert ck3.config["model_type"] == "qwen3" and ck3.config["tie_word_embeddings"] is True
    assert torch.equal(ck3.tensor("model.layers.1.self_attn.q_norm.weight"), torch.full((HEAD_DIM,), 1.5))
    assert torch.equal(ck3.tensor("model.layers.0.self_attn.k_norm.weight"), torch.full((HEAD_DIM,), 0.5))


def test_float_and_k_quant_types(tmp_path):
    rng = np.random.default_rng(5)
    a = rng.standard_normal((8, 256)).astype(np.float32)
    tensors = {"output_norm.weight": (np.ones(HIDDEN, np.float32), "F32"),
               "blk.0.ffn_up.weight": (a, "F16"), "blk.0.ffn_gate.weight": (a, "BF16"),
               "blk.0.ffn_down.weight": (a, "Q4_0")}
    expect = {"model.layers.0.mlp.up_proj.weight": a.astype(np.float16).astype(np.float32),
              "model.layers.0.mlp.gate_proj.weight": gguf.quants.dequantize(gguf.quants.quantize(a, T.BF16), T.BF16),
              "model.layers.0.mlp.down_proj.weight": gguf.quants.dequantize(gguf.quants.quantize(a, T.Q4_0), T.Q4_0)}
    # K-quants: gguf cannot quantize them; random blocks with sane fp16 super-block scales stand in
    for i, (kind, dpos) in enumerate((("Q4_K", (0, 2)), ("Q5_K", (0, 2)), ("Q6_K", (208,)))):
        raw = rng.integers(0, 256, (8, gguf.GGML_QUANT_SIZES[getattr(T, kind)][1]), dtype=np.uint8)
        for pos in dpos:
            raw[:, pos:pos + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
        tensors[f"blk.1.{['attn_q', 'attn_k', 'attn_v'][i]}.weight"] = (None, (raw, kind))
        expect[f"model.layers.1.self_attn.{['q', 'k', 'v'][i]}_proj.weight"] = gguf.quants.dequantize(raw, getattr(T, kind))
    ck = open_checkpoint(write_gguf(tmp_path / "m.gguf", tensors, arch="qwen3", meta={"qwen3.vocab_size": VOCAB}))
    assert ck.config["vocab_size"] == VOCAB
    for k, v in expect.items():
        got = ck.tensor(k).numpy()
        assert got.shape == v.shape and np.isfinite(got).all() and np.array_equal(got, v), k
    assert any(n == "F16 weights upcast to fp32 (exact)" for n in ck.notes)


@pytest.mark.parametrize("case, needle", [
    ("arch", "general.architecture 'phi3' is not supported"),
    ("type", "tensor blk.0.ffn_up.weight has type I8"),
    ("name", "GGUF tensor blk.0.ffn_gate_exps.weight is not supported"),
    ("rope_freqs", "rope_freqs.weight is not llama3-style rope scaling"),
    ("meta", "llama.attention.sliding_window = 64 is not implemented"),
    ("scaling", "rope.scaling.type 'longrope' is not supported"),
    ("layer", "block 5 but block_count is 2"),
])
def test_unsupported_refused_in_one_line(tmp_path, case, needle):
    a = np.ones((HIDDEN, 32), np.float32)
    tensors, arch, meta = {"output_norm.weight": (np.ones(HIDDEN, np.float32), "F32")}, "llama", {}
    if case == "arch":
        arch = "phi3"
    elif case == "type":
        tensors["blk.0.ffn_up.weight"] = (None, (np.ones((HIDDEN, 32), np.int8), "I8"))  # an integer tensor
    elif case == "name":
        tensors["blk.0.ffn_gate_exps.weight"] = (a, "F32")
    elif case == "rope_freqs":
        tensors["rope_freqs.weight"] = (np.ones(HEAD_DIM // 2, np.float32), "F32")
    elif case == "meta":
        meta = {"llama.attention.sliding_window": 64}
    elif case == "scaling":
        meta = {"llama.rope.scaling.type": "longrope", "llama.rope.scaling.factor": 4.0}
    else:
        tensors["blk.5.ffn_up.weight"] = (a, "F32")
    assert needle in _refused(write_gguf(tmp_path / "m.gguf", tensors, arch=arch, meta=meta))


def test_corrupt_file_and_name_map(tmp_path):
    (tmp_path / "bad.gguf").write_bytes(b"GGUF garbage")
    assert "not a readable GGUF file" in _refused(tmp_path / "bad.gguf")
    assert hf_name("blk.3.attn_output.weight", 4) == "model.layers.3.self_attn.o_proj.weight"
    assert hf_name("output.weight", 1) == "lm_head.weight"
    assert hf_name("blk.0.attn_k.bias", 1) == "model.layers.0.self_attn.k_proj.bias"


def llama_cpp_rope_factors(theta, head_dim, factor, low, high, orig):
    """The divisors llama.cpp's converter writes as rope_freqs.weight for a Llama 3 rope_scaling."""
    out = []
    for f in 1.0 / theta ** (np.arange(0, head_dim, 2) / head_dim):
        wl = 2 * np.pi / f
        if wl < orig / high:
            out.append(1.0)
        elif wl > orig / low:
            out.append(factor)
        else:
            sm = (orig / wl - low) / (high - low)
            out.append(1 / ((1 - sm) / factor + sm))
    return np.array(out, np.float32)


def _hf_llama3_inv_freq(theta, head_dim, rs):
    """transformers' llama3 inv_freq (the formula the llama family implements), written out independently."""
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2) / head_dim)
    old, lo, hi, fac = rs["original_max_position_embeddings"], rs["low_freq_factor"], rs["high_freq_factor"], rs["factor"]
    wl = 2 * np.pi / inv
    scaled = np.where(wl > old / lo, inv / fac, inv)
    sm = (old / wl - lo) / (hi - lo)
    medium = (wl >= old / hi) & (wl <= old / lo)
    return np.where(medium, (1 - sm) * scaled / fac + sm * scaled, scaled)


def test_llama3_rope_freqs_become_rope_scaling(tmp_path):
    r = llama_cpp_rope_factors(500000.0, 64, 32.0, 1.0, 4.0, 8192)  # Llama 3.2's parameters
    rs = llama3_rope_scaling(r, 500000.0, 64)
    assert rs == {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}
    # a GGUF with other parameters: the recovered ones give llama.cpp's frequencies exactly (to fp32 rounding)
    r = llama_cpp_rope_factors(100000.0, HEAD_DIM, 8.0, 1.0, 32.0, 16384)
    w = random_weights(hf_shapes())
    out = {gguf_name(k): (v, "F32") for k, v in w.items()} | {"rope_freqs.weight": (r, "F32")}
    ck = open_checkpoint(write_gguf(tmp_path / "l3.gguf", out))
    rs = ck.config["rope_scaling"]
    assert rs["rope_type"] == "llama3" and "rope_freqs.weight" not in ck.keys
    inv = 1.0 / 100000.0 ** (np.arange(0, HEAD_DIM, 2) / HEAD_DIM)
    np.testing.assert_allclose(_hf_llama3_inv_freq(100000.0, HEAD_DIM, rs), inv / r, rtol=1e-6)
    assert any(n.startswith("rope_freqs.weight read as rope_scaling") for n in ck.notes)
    bad = r.copy()
    bad[2] *= 1.3
    out["rope_freqs.weight"] = (bad, "F32")
    assert "does not follow llama3 rope scaling" in _refused(write_gguf(tmp_path / "bad.gguf", out))


def test_missing_rope_freq_base_is_a_note_not_a_silent_default(tmp_path):
    """llama.cpp takes RoPE base 10000 when a GGUF has no rope.freq_base; the reader takes it too and says so."""
    w = random_weights(hf_shapes())
    p = llama_gguf(tmp_path / "m.gguf", w, {}, rope_base=None)
    ck = open_checkpoint(p)
    assert ck.config["rope_theta"] == 10000.0
    assert any("rope.freq_base" in n and "10000" in n for n in ck.notes)
    ck_with = open_checkpoint(llama_gguf(tmp_path / "b.gguf", w, {}))
    assert not any("rope.freq_base" in n for n in ck_with.notes)
