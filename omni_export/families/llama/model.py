"""Llama / SmolLM / Qwen2 / Qwen3 decoder (fp32, export-friendly), Hugging Face parameter names.

GQA attention with NeoX (rotate-half) RoPE over the whole head, RMSNorm, SwiGLU MLP; Qwen2's q/k/v biases, Qwen3's
per-head q/k RMSNorm, a tied or untied LM head. The model follows the DecoderLM protocol (docs/design.md): every
layer takes host RoPE tables, an additive mask and static K/V caches and returns the new (post-RoPE) K/V rows, so
the shared decode-step and prefill components drive it as they drive Spark.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ...blocks.layers import FULL, Attention, DecoderLayer, GatedMLP, RMSNorm, causal_mask, rope_table
from .config import LlamaConfig


def decoder_layer(cfg: LlamaConfig) -> DecoderLayer:
    attn = Attention(cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                     cfg.rms_norm_eps, qk_norm=cfg.qk_norm, bias=cfg.qkv_bias)
    if cfg.o_bias:  # Llama / Qwen3 attention_bias: the output projection carries a bias too
        attn.o_proj = nn.Linear(cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size, bias=True)
    return DecoderLayer(cfg.hidden_size, cfg.rms_norm_eps, attn, GatedMLP(cfg.hidden_size, cfg.intermediate_size, F.silu))


class LlamaModel(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(decoder_layer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Point the LM head at the embedding when the config ties them (also after weights were assigned)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def input_embedding(self) -> nn.Embedding:
        return self.model.embed_tokens

    def expected_keys(self) -> dict[str, tuple[int, ...]]:
        """Checkpoint key -> shape (a tied head has no ``lm_head.weight``)."""
        keys = {k: tuple(v.shape) for k, v in self.state_dict().items()}
        if self.config.tie_word_embeddings:
            keys.pop("lm_head.weight", None)
        return keys

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Full-sequence causal forward without a cache: tokens [B,S] -> logits [B,S,V] (the recompute-everything
        reference the cached decode loop is checked against)."""
        B, S = tokens.shape
        cfg = self.config
        cos, sin = (torch.from_numpy(t)[None, None] for t in rope_table(cfg.inv_freq(FULL), np.arange(S)))
        mask = causal_mask(S)
        empty = torch.zeros(B, cfg.num_key_value_heads, 0, cfg.head_dim)
        x = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            x, _, _ = layer(x, cos, sin, mask, empty, empty)
        return self.lm_head(self.model.norm(x))


def random_tensors(model: LlamaForCausalLM, seed: int):
    """Deterministic fan-in-scaled random weights, one ``(name, tensor)`` at a time in parameter order: norm weights
    near 1, biases small, the embedding unit-variance (a tied head shares it and is not yielded again)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            yield name, 1.0 + 0.1 * torch.randn(p.shape, generator=g)
        elif name.endswith(".bias"):
            yield name, 0.1 * torch.randn(p.shape, generator=g)
        elif name == "model.embed_tokens.weight":
            yield name, torch.randn(p.shape, generator=g)
        else:
            yield name, torch.randn(p.shape, generator=g).div_(math.sqrt(p.shape[1]))  # in place: the same values


def init_random(model: LlamaForCausalLM, seed: int) -> LlamaForCausalLM:
    model.tie_weights()  # a module moved off the meta device has lost the tie
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, t in random_tensors(model, seed):
            params[name].copy_(t)
    return model
