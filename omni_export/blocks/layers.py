"""Building blocks every family's ``nn.Module`` s are made of, written once in the forms every target exports.

Graphs never see a Python-int position: RoPE tables (``rope_table``) and additive masks (``MASK_VALUE``) are made on
the host in fp32 and passed in; caches come in and only new K/V rows go out. The forms some targets need of these
blocks (same function, other ops) are in ``graph_forms``; a family hands them to a target through
``Component.graph_for``.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MASK_VALUE = -100.0  # additive mask: a small value keeps the 16-bit activation range tight (docs/design.md)
SLIDING, FULL = "sliding_attention", "full_attention"


class RMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * w, written as F.rms_norm (a hand-written pow/mean/rsqrt fails HTP finalization)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope_inv_freq(theta: float, rot: int) -> np.ndarray:
    """Inverse frequencies [rot // 2] (fp64) of plain RoPE with base ``theta`` over ``rot`` rotary dims."""
    return 1.0 / (theta ** (np.arange(0, rot, 2, dtype=np.float64) / rot))


def rope_table(inv_freq: np.ndarray, positions) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [S, rot] in fp32 for NeoX (rotate-half) RoPE at ``positions`` (computed in fp64, then cast)."""
    ang = np.asarray(positions, dtype=np.float64)[:, None] * np.asarray(inv_freq, dtype=np.float64)[None, :]
    ang = np.concatenate([ang, ang], axis=-1)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rot: int) -> torch.Tensor:
    """NeoX (rotate-half) RoPE on the first ``rot`` dims. x: [B, h, S, D]; cos/sin: [B, 1, S, rot]."""
    xr, xp = (x, None) if rot == x.shape[-1] else (x[..., :rot], x[..., rot:])
    x1, x2 = xr[..., : rot // 2], xr[..., rot // 2:]
    out = xr * cos + torch.cat((-x2, x1), dim=-1) * sin
    return out if xp is None else torch.cat((out, xp), dim=-1)


def grouped_attention(q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Softmax attention with grouped-query K/V. q [B,nh,S,hd]; keys/vals [B,nkv,T,hd]; mask [B,1,S,T] additive.

    The ``rep`` query heads sharing a KV head are stacked along the rows, so K/V are never copied (no
    ``repeat_interleave``) and the mask is tiled to match (rows ordered head-in-group, then position). The batched
    matmuls are 3-D ``bmm``: a 4-D ``matmul`` becomes expand + bmm in ``torch.export``, and XNNPACK does not take the
    expand (every layer cut the ExecuTorch program into more delegates).

    ``mask`` may instead be an attention of its own, an object with ``attend(q, keys, vals) -> [B,nh,S,hd]`` (the
    ExecuTorch runner form's in-place cache, ``components.decoder_runner.CacheAttention``): it is handed the queries
    and the keys/values the layer concatenated, and its result is returned as is."""
    if not isinstance(mask, torch.Tensor):
        return mask.attend(q, keys, vals)
    B, nh, S, hd = q.shape
    nkv, T = keys.shape[1], keys.shape[2]
    rep = nh // nkv
    scores = torch.bmm(q.reshape(B * nkv, rep * S, hd), keys.reshape(B * nkv, T, hd).transpose(1, 2))
    scores = scores.view(B, nkv, rep * S, T) * (1.0 / math.sqrt(hd))
    scores = scores + (mask if rep == 1 or S == 1 else mask.repeat(1, 1, rep, 1))
    probs = torch.softmax(scores, dim=-1).view(B * nkv, rep * S, T)
    return torch.bmm(probs, vals.reshape(B * nkv, T, hd)).view(B, nh, S, hd)


class Attention(nn.Module):
    """Separate q/k/v/o projections, optional per-head q/k RMSNorm (Qwen3), optional q/k/v bias (Qwen2), RoPE on the
    first ``rot`` dims (all by default), grouped-query attention over the cache plus the new rows."""

    def __init__(self, hidden: int, nh: int, nkv: int, hd: int, eps: float, qk_norm: bool, bias: bool = False,
                 rot: int | None = None):
        super().__init__()
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.rot = hd if rot is None else rot
        self.q_proj = nn.Linear(hidden, nh * hd, bias=bias)
        self.k_proj = nn.Linear(hidden, nkv * hd, bias=bias)
        self.v_proj = nn.Linear(hidden, nkv * hd, bias=bias)
        self.o_proj = nn.Linear(nh * hd, hidden, bias=False)
        if qk_norm:
            self.q_norm, self.k_norm = RMSNorm(hd, eps), RMSNorm(hd, eps)
        else:
            self.q_norm = self.k_norm = nn.Identity()

    def forward(self, x, cos, sin, mask, k_cache, v_cache):
        """x [B,S,H]; cos/sin [B,1,S,rot]; mask [B,1,S,C+S] additive; caches [B,nkv,C,hd] -> out, new K/V rows."""
        B, S, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, S, self.nh, self.hd)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, S, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(B, S, self.nkv, self.hd).transpose(1, 2)
        q, k = rotate(q, cos, sin, self.rot), rotate(k, cos, sin, self.rot)
        o = grouped_attention(q, torch.cat((k_cache, k), dim=2), torch.cat((v_cache, v), dim=2), mask)
        return self.o_proj(o.transpose(1, 2).reshape(B, S, self.nh * self.hd)), k, v


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)): SwiGLU with ``F.silu``, GeGLU with ``F.gelu`` (exact erf GELU)."""

    def __init__(self, hidden: int, inter: int, act: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.act = act
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then h + mlp(norm(h)). ``attn`` takes and returns what
    ``Attention.forward`` does; ``layer_type`` is ``FULL`` or ``SLIDING`` (which tables and mask it reads)."""

    def __init__(self, hidden: int, eps: float, attn: nn.Module, mlp: nn.Module, layer_type: str = FULL):
        super().__init__()
        self.layer_type = layer_type
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = attn
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = mlp

    def forward(self, x, cos, sin, mask, k_cache, v_cache):
        a, k, v = self.self_attn(self.input_layernorm(x), cos, sin, mask, k_cache, v_cache)
        h = x + a
        return h + self.mlp(self.post_attention_layernorm(h)), k, v


def run_layers(layers, x, cos, sin, mask, caches):
    """Every layer over ``x`` with one set of tables and mask; ``caches``: k0, v0, k1, v1, ... -> x, new K/V rows."""
    new = []
    for i, layer in enumerate(layers):
        x, k, v = layer(x, cos, sin, mask, caches[2 * i], caches[2 * i + 1])
        new += [k, v]
    return x, new


def causal_mask(n: int, window: int | None = None) -> torch.Tensor:
    """[1,1,n,n] additive causal mask (positions further back than ``window - 1`` masked too), for cache-free
    whole-sequence reference runs."""
    pos = np.arange(n)
    i, j = np.meshgrid(pos, pos, indexing="ij")
    ok = (j <= i) if window is None else (j <= i) & (j > i - window)
    return torch.from_numpy(np.where(ok, 0.0, -1e9).astype(np.float32))[None, None]


class CausalConv(nn.Module):
    """Left-padded conv (stride 1): pads ``(k-1)*dilation`` zeros, so output t sees inputs <= t."""

    def __init__(self, cin, cout, k, dilation=1, groups=1):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, k, dilation=dilation, groups=groups)
        self.tail = (k - 1) * dilation   # input samples of left context the conv needs

    def forward(self, x):
        return self.conv(F.pad(x, (self.tail, 0)))

    def step(self, x, tail):
        """Streaming: ``tail`` [B,C,self.tail] holds the previous inputs; returns output and the new tail."""
        xx = torch.cat((tail, x), dim=-1)
        return self.conv(xx), xx[..., xx.shape[-1] - self.tail:]


class CausalTransConv(nn.Module):
    """Transposed conv (kernel k, stride s) with the last ``k - s`` samples trimmed: output length L*s."""

    def __init__(self, cin, cout, k, s):
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, k, stride=s)
        self.k, self.s = k, s
        self.tail = 1 if k > s else 0  # input frames whose output overlaps the next chunk (k <= 2s here)

    def forward(self, x):
        y = self.conv(x)
        return y[..., : y.shape[-1] - (self.k - self.s)] if self.k > self.s else y

    def step(self, x, tail):
        if self.tail == 0:
            return self.forward(x), tail
        y = self.conv(torch.cat((tail, x), dim=-1))  # [(L+1)*s + (k-s)]; the first s belong to the last chunk
        L = x.shape[-1]
        return y[..., self.s: self.s + L * self.s], x[..., L - 1:]
