"""Gemma 3 text decoder (fp32, export-friendly), Hugging Face parameter names and conventions.

GQA attention with NeoX (rotate-half) RoPE over the whole head, per-head q/k RMSNorm, queries scaled by
``query_pre_attn_scalar ** -0.5``; RMSNorm before and after attention and before and after the GeGLU MLP (tanh GELU);
embeddings scaled by sqrt(hidden); sliding-window and full-attention layers (RoPE base per layer type); tied head.

Gemma's RMSNorm multiplies by ``1 + w`` (``GemmaRMSNorm``: ``weight`` holds Hugging Face's zero-centred w, so state
dicts read and write HF checkpoints as they are). Graphs never see that form: ``graph_form`` folds every norm into a
plain ``layers.RMSNorm`` whose weight is the multiplier (computed once in fp32, as the eager model computes it), and
can carry the residual stream scaled by a power of two (``residual_scale``, exact: see ``graph_form``). The host
gathers the raw embedding row (the tied table); layer 0 applies the sqrt(hidden) scale (``in_scale``).
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ...blocks.layers import FULL, Attention, GatedMLP, RMSNorm, causal_mask, rope_table
from .config import Gemma3Config

gelu_tanh = functools.partial(F.gelu, approximate="tanh")


class GemmaRMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * ((1 + w) * scale); ``scale`` is a fixed multiplier (the queries' extra scale)."""

    def __init__(self, dim: int, eps: float, scale: float = 1.0):
        super().__init__()
        self.eps, self.scale = eps, scale
        self.weight = nn.Parameter(torch.zeros(dim))

    def multiplier(self) -> torch.Tensor:
        m = 1.0 + self.weight
        return m if self.scale == 1.0 else m * self.scale

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.multiplier(), self.eps)

    def folded(self, scale: float = 1.0, eps_scale: float = 1.0) -> RMSNorm:
        """The plain RMSNorm of the same function with its output times ``scale`` and eps times ``eps_scale`` (powers
        of two keep both exact)."""
        n = RMSNorm(self.weight.shape[0], self.eps * eps_scale)
        with torch.no_grad():
            n.weight = nn.Parameter(self.multiplier().detach() * scale, requires_grad=False)
        return n


class Gemma3DecoderLayer(nn.Module):
    """x' = x + post_attn(attn(input_norm(x))); out = x' + post_ffw(mlp(pre_ffw(x'))). ``in_scale`` (layer 0 only)
    multiplies the layer's input first: the embedding scale. Takes and returns what ``layers.DecoderLayer`` does."""

    def __init__(self, layer_type: str, attn: nn.Module, mlp: nn.Module, norms: dict[str, nn.Module],
                 in_scale: float | None = None):
        super().__init__()
        self.layer_type, self.in_scale = layer_type, in_scale
        self.input_layernorm = norms["input_layernorm"]
        self.self_attn = attn
        self.post_attention_layernorm = norms["post_attention_layernorm"]
        self.pre_feedforward_layernorm = norms["pre_feedforward_layernorm"]
        self.mlp = mlp
        self.post_feedforward_layernorm = norms["post_feedforward_layernorm"]

    def forward(self, x, cos, sin, mask, k_cache, v_cache):
        if self.in_scale is not None:
            x = x * self.in_scale
        a, k, v = self.self_attn(self.input_layernorm(x), cos, sin, mask, k_cache, v_cache)
        h = x + self.post_attention_layernorm(a)
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h))), k, v


NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")


def decoder_layer(cfg: Gemma3Config, i: int) -> Gemma3DecoderLayer:
    eps = cfg.rms_norm_eps
    attn = Attention(cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, eps, qk_norm=False)
    attn.q_norm, attn.k_norm = GemmaRMSNorm(cfg.head_dim, eps, cfg.query_scale), GemmaRMSNorm(cfg.head_dim, eps)
    mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, gelu_tanh)
    return Gemma3DecoderLayer(cfg.layer_types[i], attn, mlp, {n: GemmaRMSNorm(cfg.hidden_size, eps) for n in NORMS},
                              cfg.embed_scale if i == 0 else None)


class Gemma3TextModel(nn.Module):
    def __init__(self, cfg: Gemma3Config, layers=None, norm=None, embed_tokens=None):
        super().__init__()
        self.embed_tokens = embed_tokens if embed_tokens is not None else nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(layers if layers is not None else
                                    (decoder_layer(cfg, i) for i in range(cfg.num_hidden_layers)))
        self.norm = norm if norm is not None else GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Gemma3ForCausalLM(nn.Module):
    def __init__(self, cfg: Gemma3Config, model: Gemma3TextModel | None = None, lm_head: nn.Linear | None = None):
        super().__init__()
        self.config = cfg
        self.model = model if model is not None else Gemma3TextModel(cfg)
        self.lm_head = lm_head if lm_head is not None else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.graph_rewrite: dict | None = None  # set on graph forms: what ``graph_form`` did (data for manifests)
        if lm_head is None:
            self.tie_weights()

    def tie_weights(self) -> None:
        """Point the LM head at the embedding when the config ties them (also after weights were assigned)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def input_embedding(self) -> nn.Embedding:
        """The raw table the host gathers rows from (layer 0 applies the sqrt(hidden) scale)."""
        return self.model.embed_tokens

    def expected_keys(self) -> dict[str, tuple[int, ...]]:
        """Checkpoint key -> shape (a tied head has no ``lm_head.weight``)."""
        keys = {k: tuple(v.shape) for k, v in self.state_dict().items()}
        if self.config.tie_word_embeddings:
            keys.pop("lm_head.weight", None)
        return keys

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Full-sequence causal forward without a cache: tokens [B,S] -> logits [B,S,V] (sliding layers masked to
        their window), the recompute-everything reference the cached loop is checked against."""
        return self.lm_head(self.model.norm(self.hidden_states(tokens)[-1]))

    @torch.no_grad()
    def hidden_states(self, tokens: torch.Tensor) -> list[torch.Tensor]:
        """The residual stream [B,S,H] entering each layer, then after the last one (num_hidden_layers + 1 tensors)."""
        B, S = tokens.shape
        cfg = self.config
        x, out = self.model.embed_tokens(tokens), []  # in the model's dtype (fp16 for torch's fp16 emulation)
        empty = torch.zeros(B, cfg.num_key_value_heads, 0, cfg.head_dim, dtype=x.dtype)
        for layer in self.model.layers:
            out.append(x if layer.in_scale is None else x * layer.in_scale)
            cos, sin = (torch.from_numpy(t)[None, None].to(x.dtype)
                        for t in rope_table(cfg.inv_freq(layer.layer_type), np.arange(S)))
            mask = causal_mask(S, None if layer.layer_type == FULL else cfg.sliding_window).to(x.dtype)
            x, _, _ = layer(x, cos, sin, mask, empty, empty)
        return out + [x]


def _scaled_linear(lin: nn.Linear, c: float) -> nn.Linear:
    if c == 1.0:
        return lin
    out = nn.Linear(lin.in_features, lin.out_features, bias=False)
    out.weight = nn.Parameter(lin.weight.detach() * c, requires_grad=False)
    return out


def graph_form(lm: Gemma3ForCausalLM, residual_scale: float = 1.0, branch_scale: float = 1.0) -> Gemma3ForCausalLM:
    """The model the graphs are exported from: the same function, with every Gemma norm folded into a plain RMSNorm.

    RMSNorm is invariant to the scale of its input (with eps scaled by the square), which leaves room for exact
    rewrites. ``residual_scale`` s carries the residual stream as s * h: the embedding scale and the post-attention /
    post-feed-forward norm weights are multiplied by s, and every norm that reads the stream (input, pre-feed-forward,
    final) takes eps * s^2. ``branch_scale`` c does the same inside each block: o_proj and down_proj weights times c,
    the post norms' eps times c^2. With powers of two every product is exact in fp32 (only subnormals could round);
    the projections and the LM head are shared with ``lm`` (not copied) unless scaled. Records what it did in
    ``graph_rewrite``."""
    for name, v in (("residual_scale", residual_scale), ("branch_scale", branch_scale)):
        if not (v > 0 and math.log2(v).is_integer()):
            raise ValueError(f"{name} must be a power of two, got {v}")
    s, c = float(residual_scale), float(branch_scale)
    cfg = lm.config
    layers = []
    for layer in lm.model.layers:
        a = layer.self_attn
        attn = Attention(cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                         cfg.rms_norm_eps, qk_norm=False).to("meta")
        attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj = a.q_proj, a.k_proj, a.v_proj, _scaled_linear(a.o_proj, c)
        attn.q_norm, attn.k_norm = a.q_norm.folded(), a.k_norm.folded()
        mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, gelu_tanh).to("meta")
        mlp.gate_proj, mlp.up_proj, mlp.down_proj = layer.mlp.gate_proj, layer.mlp.up_proj, _scaled_linear(layer.mlp.down_proj, c)
        norms = {"input_layernorm": layer.input_layernorm.folded(eps_scale=s * s),
                 "post_attention_layernorm": layer.post_attention_layernorm.folded(scale=s, eps_scale=c * c),
                 "pre_feedforward_layernorm": layer.pre_feedforward_layernorm.folded(eps_scale=s * s),
                 "post_feedforward_layernorm": layer.post_feedforward_layernorm.folded(scale=s, eps_scale=c * c)}
        in_scale = None if layer.in_scale is None else float(np.float32(layer.in_scale) * np.float32(s))
        layers.append(Gemma3DecoderLayer(layer.layer_type, attn, mlp, norms, in_scale))
    model = Gemma3TextModel(cfg, layers, lm.model.norm.folded(eps_scale=s * s), lm.model.embed_tokens)
    out = Gemma3ForCausalLM(cfg, model, lm.lm_head).eval().requires_grad_(False)
    out.graph_rewrite = {
        "norms": "Gemma (1 + w) norms folded into RMSNorm multipliers (fp32)",
        "residual_scale": s, "branch_scale": c,
        "applied": ("residual stream carried as residual_scale * h: embedding scale and post-attention/post-feed-"
                    "forward norm weights x residual_scale; input, pre-feed-forward and final norms eps x "
                    "residual_scale^2; o_proj and down_proj weights x branch_scale with the post norms' eps x "
                    "branch_scale^2 (RMSNorm is invariant to its input's scale: the same function)"),
    }
    return out


def random_tensors(model: Gemma3ForCausalLM, seed: int):
    """Deterministic fan-in-scaled random weights, one ``(name, tensor)`` at a time in parameter order: norm weights
    (zero-centred, Gemma's convention) small, the embedding unit-variance (a tied head is not yielded again)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            yield name, 0.1 * torch.randn(p.shape, generator=g)
        elif name == "model.embed_tokens.weight":
            yield name, torch.randn(p.shape, generator=g).div_(math.sqrt(p.shape[1]))  # Gemma scales it back up
        else:
            yield name, torch.randn(p.shape, generator=g).div_(math.sqrt(p.shape[1]))


def init_random(model: Gemma3ForCausalLM, seed: int) -> Gemma3ForCausalLM:
    model.tie_weights()
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, t in random_tensors(model, seed):
            params[name].copy_(t)
    return model
