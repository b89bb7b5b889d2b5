"""GGUF files (llama.cpp's format) for Llama / Qwen2 / Qwen3 decoders, read with the ``gguf`` package.

- Tensors are dequantized to fp32 on demand with ``gguf.quants.dequantize`` (every type it implements:
  ``SUPPORTED_TYPES``); the quantized model *is* the reference: its rounding is part of the weights.
- GGUF lists dimensions fastest-first; the arrays the reader hands out are already row-major in PyTorch order, and
  the declared shape reversed must equal them (checked).
- llama.cpp's converter permutes the Q and K rows (and biases) of ``llama`` models for its interleaved RoPE; they are
  permuted back here the way Hugging Face's GGUF loader does (``LlamaTensorProcessor``), so the weights match the HF
  rotate-half RoPE. Qwen2/Qwen3 are converted without that permutation (NeoX RoPE in llama.cpp), so none is undone.
- Names map to Hugging Face names; the config dict is built from the ``<arch>.*`` metadata and any metadata key this
  reader does not implement is a one-line error, never skipped.
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from ..artifacts.hashing import hash_file
from ..errors import CheckpointError
from .tokenizer import gguf_tokenizer

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                   "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS", "TQ1_0",
                   "TQ2_0", "MXFP4", "NVFP4")  # every type gguf.quants.dequantize implements (gguf 0.19)
_FLOAT_TYPES = ("F32", "F16", "BF16")

_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.([a-z_]+)\.(weight|bias)")
_TOP_RE = re.compile(r"([a-z_]+)\.(weight|bias)")

# <arch>.<key> metadata this reader turns into config fields (all others refused)
_ARCH_KEYS = {
    "block_count", "context_length", "embedding_length", "feed_forward_length", "vocab_size",
    "attention.head_count", "attention.head_count_kv", "attention.layer_norm_rms_epsilon",
    "attention.key_length", "attention.value_length", "rope.freq_base", "rope.dimension_count",
    "rope.scaling.type", "rope.scaling.factor", "rope.scaling.original_context_length", "rope.scaling.finetuned",
    "rope.scale_linear", "expert_count", "expert_used_count",
}


def hf_name(name: str, n_layers: int) -> str:
    """Hugging Face name of a GGUF tensor name (one-line error for a tensor this reader does not know)."""
    m = _BLOCK_RE.fullmatch(name)
    if m and m.group(2) in _BLOCK:
        if int(m.group(1)) >= n_layers:
            raise CheckpointError(f"GGUF tensor {name}: block {m.group(1)} but block_count is {n_layers}")
        return f"model.layers.{int(m.group(1))}.{_BLOCK[m.group(2)]}.{m.group(3)}"
    m = _TOP_RE.fullmatch(name)
    if m and m.group(1) in _TOP:
        return f"{_TOP[m.group(1)]}.{m.group(2)}"
    raise CheckpointError(f"GGUF tensor {name} is not supported by the llama/qwen2/qwen3 reader")


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (rows grouped per head as [pairs, 2] -> HF's [2, half])."""
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise CheckpointError(f"Q/K tensor with {rows} rows cannot be split into {n_head} heads of pairs")
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter permutation (the inverse of ``unpermute_qk``); used to write test GGUFs."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def f32_decimal(v) -> float:
    """A GGUF float32 field as the decimal it was written from (1e-05, not 9.99999974738e-06)."""
    return float(str(np.float32(v)))


def llama3_rope_scaling(factors: np.ndarray, theta: float, head_dim: int, orig: int = 8192) -> dict:
    """The ``llama3`` rope_scaling whose per-frequency divisors are ``factors`` (llama.cpp's ``rope_freqs`` tensor).

    llama.cpp stores the divisors, not the parameters. In the band between the two cut-offs the divisor r obeys
    1/r = (1 - s)/factor + s with s linear in 1/wavelength; fitting that line gives low/high_freq_factor relative to
    ``original_max_position_embeddings`` (any value reproduces the same frequencies; Llama 3's 8192 is used). The fit
    is checked against every stored divisor; anything else is refused."""
    r = np.asarray(factors, np.float64).reshape(-1)
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if r.shape != inv.shape or not np.all(np.isfinite(r)) or r.min() <= 0:
        raise CheckpointError(f"GGUF rope_freqs.weight has {r.size} entries; expected {inv.size} positive factors")
    factor = float(r.max())
    band = (r > 1 + 1e-6) & (r < factor * (1 - 1e-6))
    if factor <= 1 + 1e-6 or band.sum() < 2:
        raise CheckpointError("GGUF rope_freqs.weight is not llama3-style rope scaling (no interpolated band to fit)")
    s = (1 / r[band] - 1 / factor) / (1 - 1 / factor)
    a, b = np.polyfit(orig * inv[band] / (2 * np.pi), s, 1)  # s = a * orig/wavelength + b; a = 1/(high-low), b = -low*a
    low = float(f"{-b / a:.6g}")
    high = float(f"{low + 1 / a:.6g}")
    cfg = {"rope_type": "llama3", "factor": float(f"{factor:.6g}"), "low_freq_factor": low, "high_freq_factor": high,
           "original_max_position_embeddings": orig}
    wl = 2 * np.pi / inv
    sm = np.clip((orig / wl - low) / (high - low), 0.0, 1.0)
    expect = 1 / ((1 - sm) / cfg["factor"] + sm)
    if not np.allclose(expect, r, rtol=1e-4, atol=0):
        raise CheckpointError("GGUF rope_freqs.weight does not follow llama3 rope scaling "
                              f"(worst factor off by {np.max(np.abs(expect / r - 1)):.2e})")
    return cfg


def _metadata(reader) -> dict:
    meta = {}
    for k, f in reader.fields.items():
        try:
            meta[k] = f.contents()
        except Exception as e:  # a malformed field
            raise CheckpointError(f"GGUF metadata {k} cannot be read: {e}") from None
    return meta


def _rope_scaling(get, arch: str) -> dict | None:
    kind, factor = get("rope.scaling.type"), get("rope.scaling.factor")
    if get("rope.scale_linear") is not None:
        kind, factor = kind or "linear", factor if factor is not None else get("rope.scale_linear")
    if kind in (None, "none"):
        if factor not in (None, 1.0):
            raise CheckpointError(f"GGUF {arch}.rope.scaling.factor {factor} without a scaling type")
        return None
    if factor is None:
        raise CheckpointError(f"GGUF {arch}.rope.scaling.type {kind!r} without {arch}.rope.scaling.factor")
    if kind == "linear":
        return {"rope_type": "linear", "factor": f32_decimal(factor)}
    if kind == "yarn":
        orig = get("rope.scaling.original_context_length")
        if orig is None:
            raise CheckpointError(f"GGUF yarn rope scaling without {arch}.rope.scaling.original_context_length")
        return {"rope_type": "yarn", "factor": f32_decimal(factor), "original_max_position_embeddings": int(orig)}
    raise CheckpointError(f"GGUF {arch}.rope.scaling.type {kind!r} is not supported (none, linear, yarn)")


def build_config(meta: dict, tensor_names: set[str]) -> dict:
    """A Hugging Face config dict from GGUF metadata."""
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise CheckpointError(f"GGUF general.architecture {arch!r} is not supported (llama, qwen2, qwen3)")
    if meta.get("split.count", 1) not in (0, 1):
        raise CheckpointError(f"GGUF file is one of {meta['split.count']} splits; merge them first (llama-gguf-split)")
    for k, v in meta.items():
        if k.startswith(arch + ".") and k[len(arch) + 1:] not in _ARCH_KEYS:
            raise CheckpointError(f"GGUF metadata {k} = {str(v)[:40]} is not implemented by the {arch} reader")

    def get(key, default=None):
        return meta.get(f"{arch}.{key}", default)

    def need(key):
        v = get(key)
        if v is None:
            raise CheckpointError(f"GGUF metadata {arch}.{key} is missing")
        return v

    if get("expert_count", 0):
        raise CheckpointError(f"GGUF {arch}.expert_count {get('expert_count')}: mixture-of-experts is not supported")
    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    head_dim = int(get("attention.key_length", hidden // heads))
    if int(get("attention.value_length", head_dim)) != head_dim:
        raise CheckpointError(f"GGUF {arch}.attention.value_length {get('attention.value_length')} differs from "
                              f"key_length {head_dim}")
    if int(get("rope.dimension_count", head_dim)) != head_dim:
        raise CheckpointError(f"GGUF {arch}.rope.dimension_count {get('rope.dimension_count')}: partial rotary "
                              f"(head_dim {head_dim}) is not supported")
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = len(tokens) if tokens else get("vocab_size")
    if tokens and get("vocab_size") is not None and int(get("vocab_size")) != len(tokens):
        raise CheckpointError(f"GGUF {arch}.vocab_size {get('vocab_size')} differs from its {len(tokens)} tokens")
    cfg = {
        "model_type": arch, "architectures": [ARCHITECTURES[arch]],
        "num_hidden_layers": int(need("block_count")), "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")), "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)), "head_dim": head_dim,
        "hidden_act": "silu", "rms_norm_eps": f32_decimal(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": f32_decimal(get("rope.freq_base", 10000.0)), "rope_scaling": _rope_scaling(get, arch),
        "max_position_embeddings": int(need("context_length")), "vocab_size": None if vocab is None else int(vocab),
        "tie_word_embeddings": "output.weight" not in tensor_names,
    }
    if arch != "qwen2":  # Qwen2 always has q/k/v biases; Llama and Qwen3 declare them
        cfg["attention_bias"] = any(n.endswith(".attn_q.bias") for n in tensor_names)
    for key in ("bos_token_id", "eos_token_id", "padding_token_id"):
        if meta.get(f"tokenizer.ggml.{key}") is not None:
            cfg[key.replace("padding", "pad")] = int(meta[f"tokenizer.ggml.{key}"])
    return cfg


class _GGUFReader:
    def __init__(self, reader, config: dict, by_key: dict):
        self.reader, self.config, self.by_key = reader, config, by_key

    def tensor(self, key: str) -> torch.Tensor:
        from gguf import quants

        t = self.by_key[key]
        w = quants.dequantize(t.data, t.tensor_type)
        shape = tuple(int(d) for d in reversed(t.shape))
        if w.shape != shape:
            w = w.reshape(shape)
        if self.config["model_type"] == "llama" and key.split(".")[-2] in ("q_proj", "k_proj"):
            heads = self.config["num_attention_heads" if ".q_proj." in key else "num_key_value_heads"]
            w = unpermute_qk(w, heads)
        if w.dtype != np.float32 or not (w.flags.writeable and w.flags.c_contiguous):
            w = np.array(w, dtype=np.float32, order="C")  # F32 tensors come back as views of the mapped file
        return torch.from_numpy(w)

    def close(self) -> None:
        self.reader = self.by_key = None


def open_gguf(path: Path):
    from gguf import GGUFReader

    from .base import Checkpoint

    path = Path(path)
    try:
        reader = GGUFReader(str(path), "r")
    except Exception as e:  # the gguf package raises ValueError/struct errors/... for a malformed file
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(f"{path.name} is not a readable GGUF file: {why}") from None
    meta = _metadata(reader)
    names = {t.name for t in reader.tensors}
    if len(names) != len(reader.tensors):
        dup = [n for n, c in Counter(t.name for t in reader.tensors).items() if c > 1]
        raise CheckpointError(f"{path.name}: tensor {dup[0]} appears twice")
    config = build_config(meta, names)
    by_key, keys, types, notes = {}, {}, Counter(), []
    for t in reader.tensors:
        kind = t.tensor_type.name
        if kind not in SUPPORTED_TYPES:
            raise CheckpointError(f"{path.name}: tensor {t.name} has type {kind}; "
                                  f"supported: {', '.join(SUPPORTED_TYPES)}")
        if t.name == "rope_freqs.weight":  # llama.cpp's form of Llama 3's rope scaling: a config field, not a weight
            if config["model_type"] != "llama" or config["rope_scaling"] is not None:
                raise CheckpointError(f"{path.name}: rope_freqs.weight with {config['model_type']} rope scaling "
                                      f"{config['rope_scaling']} is not supported")
            from gguf import quants
            config["rope_scaling"] = llama3_rope_scaling(quants.dequantize(t.data, t.tensor_type),
                                                         config["rope_theta"], config["head_dim"])
            notes.append(f"rope_freqs.weight read as rope_scaling {config['rope_scaling']}")
            continue
        key = hf_name(t.name, config["num_hidden_layers"])
        by_key[key] = t
        keys[key] = tuple(int(d) for d in reversed(t.shape))
        types[kind] += 1
    if config["vocab_size"] is None:
        if "model.embed_tokens.weight" not in keys:
            raise CheckpointError(f"{path.name} has neither a token list nor a vocab_size nor token_embd.weight")
        config["vocab_size"] = keys["model.embed_tokens.weight"][0]
    if f"{meta.get('general.architecture')}.rope.freq_base" not in meta:  # llama.cpp takes 10000 then too: say so
        notes.append("the GGUF has no rope.freq_base: llama.cpp's default 10000 taken")
    tokenizer = gguf_tokenizer(meta, f"gguf:{path.stem}")
    quantized = sorted(k for k in types if k not in _FLOAT_TYPES)
    notes += [f"{k} weights dequantized to fp32: their rounding is part of the reference model" for k in quantized]
    notes += [f"{k} weights upcast to fp32 (exact)" for k in sorted(types) if k in ("F16", "BF16")]
    if config["model_type"] == "llama":
        notes.append("llama.cpp's Q/K row permutation undone (Hugging Face rotate-half RoPE layout)")
    if tokenizer is None:
        notes.append("the GGUF embeds no tokenizer")
    summary = ", ".join(f"{k} x{n}" for k, n in types.most_common())
    what = f"{'+'.join(quantized)} dequantized" if quantized else "float"
    return Checkpoint(config=config, keys=keys, weights_hash=hash_file(path), tokenizer=tokenizer,
                      source=f"gguf {path.stem} ({what}; {summary})", notes=tuple(notes),
                      _reader=_GGUFReader(reader, config, by_key))
