"""Builders for the checkpoint tests: tiny Llama-shaped weights, GGUF files written with gguf.GGUFWriter, and a
byte-level BPE tokenizer trained with the tokenizers library."""
from __future__ import annotations

import json

import numpy as np
HIDDEN, HEADS, KV_HEADS, FFN, LAYERS, VOCAB = 64, 4, 2, 128, 2, 300
HEAD_DIM = HIDDEN // HEADS

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "The capital of France is Paris; the capital of Italy is Rome.",
    "Numbers like 12345 and 2026 appear in text, as do symbols: #, %, &.",
    "Ünïcödé text — café, naïve, 日本語 — and emoji 😀 round-trip too.",
    "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\nHi!<|im_end|>",
] * 4


def hf_shapes(tied: bool = True, bias: bool = False) -> dict[str, tuple]:
    s = {"model.embed_tokens.weight": (VOCAB, HIDDEN), "model.norm.weight": (HIDDEN,)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        s |= {p + "self_attn.q_proj.weight": (HIDDEN, HIDDEN), p + "self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
              p + "self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN), p + "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
              p + "mlp.gate_proj.weight": (FFN, HIDDEN), p + "mlp.up_proj.weight": (FFN, HIDDEN),
              p + "mlp.down_proj.weight": (HIDDEN, FFN), p + "input_layernorm.weight": (HIDDEN,),
              p + "post_attention_layernorm.weight": (HIDDEN,)}
        if bias:
            s |= {p + "self_attn.q_proj.bias": (HIDDEN,), p + "self_attn.k_proj.bias": (KV_HEADS * HEAD_DIM,),
                  p + "self_attn.v_proj.bias": (KV_HEADS * HEAD_DIM,)}
    if not tied:
        s["lm_head.weight"] = (VOCAB, HIDDEN)
    return s


def random_weights(shapes: dict[str, tuple], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: (rng.standard_normal(s) * 0.05).astype(np.float32) for k, s in shapes.items()}


def train_tokenizer():
    """A small byte-level BPE (GPT-2 style) with chat special tokens, trained on CORPUS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def tokenizer_metadata(tok) -> dict:
    """tokens / merges / token types of a trained tokenizer, as a GGUF stores them."""
    d = json.loads(tok.to_str())
    vocab = d["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in d["model"]["merges"]]
    special = {a["content"] for a in d["added_tokens"] if a["special"]}
    return {"tokens": tokens, "merges": merges, "types": [3 if t in special else 1 for t in tokens]}


def write_gguf(path, tensors: dict, arch: str = "llama", meta: dict | None = None, tokenizer=None, n_layers=LAYERS,
               pre: str = "gpt2", rope_base: float | None = 100000.0):
    """Write a GGUF: ``tensors`` maps GGUF name -> (fp32 array in PyTorch order, GGML type name or raw bytes+type)."""
    import gguf
    from gguf import GGMLQuantizationType as T

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(n_layers)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    if rope_base is not None:
        w.add_rope_freq_base(rope_base)
    for k, v in (meta or {}).items():
        if isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        else:
            w.add_string(k, v)
    if tokenizer is not None:
        m = tokenizer_metadata(tokenizer)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(m["tokens"])
        w.add_token_merges(m["merges"])
        w.add_token_types(m["types"])
        w.add_bos_token_id(m["tokens"].index("<|im_start|>"))
        w.add_eos_token_id(m["tokens"].index("<|im_end|>"))
    for name, (arr, kind) in tensors.items():
        if isinstance(kind, tuple):  # (raw bytes [rows, nbytes], type name): written as is
            w.add_tensor(name, kind[0], raw_dtype=getattr(T, kind[1]))
            continue
        qt = getattr(T, kind)
        data = gguf.quants.quantize(arr, qt) if kind not in ("F32", "F16") else arr.astype(
            np.float16 if kind == "F16" else np.float32)
        if kind in ("F32", "F16"):
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
