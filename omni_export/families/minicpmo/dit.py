"""The flow-matching estimator (stepaudio2 ``DiT``): 16 adaLN-Zero blocks on the timestep, qk-norm attention, a
causal conv block with Mish, a GELU-tanh MLP. Parameter names are the official ``flow.pt`` keys under
``decoder.estimator.``.

Two forms of one function: ``DiT.full`` (the whole utterance, an additive attention mask saying which frames each
frame sees: the streaming schedule's blocks and cache trimming) and ``DiTStep`` (one estimator call on a chunk of
the CFG batch with carried caches: the graph the host's Euler loop calls 20 times per chunk). The sinusoidal
timestep embedding is computed on the host in fp64 (``timestep_freq``; t * 1000 rad is beyond what fp16 resolves)
and fed in, as RoPE tables are for the language models.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import DiTConfig


def timestep_freq(t: np.ndarray, dim: int, max_period: float = 10000.0) -> np.ndarray:
    """[B] timesteps in [0, 1] -> [B, dim] sinusoid of t * 1000 (cos half, then sin half), in fp64."""
    half = dim // 2
    freqs = np.exp(-math.log(max_period) * np.arange(half, dtype=np.float64) / half)
    args = np.asarray(t, np.float64)[:, None] * 1000.0 * freqs[None]
    return np.concatenate([np.cos(args), np.sin(args)], axis=-1)


class Mish(nn.Module):
    """x * tanh(softplus(x)) with softplus written as relu(x) + log(1 + exp(-|x|)): the same function, no exp of
    a positive number (fp16-safe), and ops the QNN HTP EP takes (it refuses ONNX ``Mish``)."""

    def forward(self, x):
        return x * torch.tanh(F.relu(x) + torch.log(1.0 + torch.exp(-torch.abs(x))))


def modulate(x, shift, scale):
    return x * (1 + scale) + shift


class Attention(nn.Module):
    def __init__(self, c: DiTConfig):
        super().__init__()
        inner = c.heads * c.head_dim
        self.h, self.hd = c.heads, c.head_dim
        self.to_q = nn.Linear(c.hidden, inner)
        self.to_k = nn.Linear(c.hidden, inner)
        self.to_v = nn.Linear(c.hidden, inner)
        self.q_norm = nn.LayerNorm(c.head_dim)
        self.k_norm = nn.LayerNorm(c.head_dim)
        self.proj = nn.Linear(inner, c.hidden)

    def qkv(self, x):
        B, T, _ = x.shape
        heads = [f(x).view(B, T, self.h, self.hd).transpose(1, 2) for f in (self.to_q, self.to_k, self.to_v)]
        return self.q_norm(heads[0]), self.k_norm(heads[1]), heads[2]

    def attend(self, q, k, v, mask):
        """q [B,h,S,hd], k/v [B,h,T,hd], mask additive broadcastable to [B,h,S,T]."""
        B, h, S, hd = q.shape
        T = k.shape[2]
        s = torch.bmm(q.reshape(B * h, S, hd), k.reshape(B * h, T, hd).transpose(1, 2)).view(B, h, S, T)
        p = torch.softmax(s * (1.0 / math.sqrt(hd)) + mask, dim=-1).view(B * h, S, T)
        o = torch.bmm(p, v.reshape(B * h, T, hd)).view(B, h, S, hd)
        return self.proj(o.transpose(1, 2).reshape(B, S, h * hd))


class ConvBlock(nn.Module):
    """``block``: [transpose, CausalConv1d k3, transpose, LayerNorm, Mish, transpose, CausalConv1d k3, transpose]
    (the official indices: keys ``block.1``, ``block.3``, ``block.6``)."""

    def __init__(self, c: DiTConfig):
        super().__init__()
        H = c.hidden
        self.block = nn.Sequential(nn.Identity(), nn.Conv1d(H, H, 3), nn.Identity(), nn.LayerNorm(H), Mish(),
                                   nn.Identity(), nn.Conv1d(H, H, 3), nn.Identity())

    def step(self, x, cache):
        """x [B,T,H]; cache [B,2H,2] (the last 2 inputs of each conv) -> out [B,T,H], new cache."""
        H = x.shape[-1]
        a = torch.cat((cache[:, :H], x.transpose(1, 2)), dim=2)
        h = self.block[4](self.block[3](self.block[1](a).transpose(1, 2))).transpose(1, 2)
        b = torch.cat((cache[:, H:], h), dim=2)
        new = torch.cat((a[..., a.shape[-1] - 2:], b[..., b.shape[-1] - 2:]), dim=1)
        return self.block[6](b).transpose(1, 2), new


class DiTBlock(nn.Module):
    def __init__(self, c: DiTConfig):
        super().__init__()
        H = c.hidden
        self.norm1 = nn.LayerNorm(H, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(c)
        self.norm2 = nn.LayerNorm(H, elementwise_affine=False, eps=1e-6)
        self.mlp = nn.Module()
        self.mlp.fc1 = nn.Linear(H, int(H * c.mlp_ratio))
        self.mlp.fc2 = nn.Linear(int(H * c.mlp_ratio), H)
        self.norm3 = nn.LayerNorm(H, elementwise_affine=False, eps=1e-6)
        self.conv = ConvBlock(c)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(H, 9 * H))

    def forward(self, x, c, mask, conv_cache, kv_cache):
        """x [B,T,H]; c [B,1,H]; mask additive [B or 1,1,T,T+C]; conv_cache [B,2H,2]; kv_cache [B,h,C,2hd] (k||v,
        may be empty) -> x, new conv cache, new K/V rows [B,h,T,2hd]."""
        mods = self.adaLN_modulation(c).chunk(9, dim=-1)
        sh_a, sc_a, g_a, sh_m, sc_m, g_m, sh_c, sc_c, g_c = mods
        q, k, v = self.attn.qkv(modulate(self.norm1(x), sh_a, sc_a))
        hd = q.shape[-1]
        keys = torch.cat((k, kv_cache[..., :hd]), dim=2)   # upstream order: [new, cache]
        vals = torch.cat((v, kv_cache[..., hd:]), dim=2)
        x = x + g_a * self.attn.attend(q, keys, vals, mask)
        h, conv_new = self.conv.step(modulate(self.norm3(x), sh_c, sc_c), conv_cache)
        x = x + g_c * h
        m = self.mlp.fc2(F.gelu(self.mlp.fc1(modulate(self.norm2(x), sh_m, sc_m)), approximate="tanh"))
        return x + g_m * m, conv_new, torch.cat((k, v), dim=-1)


class TimestepEmbedder(nn.Module):
    def __init__(self, c: DiTConfig):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(c.freq_dim, c.hidden), nn.SiLU(), nn.Linear(c.hidden, c.hidden))


class FinalLayer(nn.Module):
    def __init__(self, c: DiTConfig):
        super().__init__()
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(c.hidden, 2 * c.hidden))
        self.norm_final = nn.LayerNorm(c.hidden, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(c.hidden, c.out_channels)

    def forward(self, x, c):
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=-1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class DiT(nn.Module):
    def __init__(self, c: DiTConfig):
        super().__init__()
        self.config = c
        self.t_embedder = TimestepEmbedder(c)
        self.in_proj = nn.Linear(c.in_channels, c.hidden)
        self.blocks = nn.ModuleList(DiTBlock(c) for _ in range(c.depth))
        self.final_layer = FinalLayer(c)

    def run(self, x, mu, t_freq, spks, cond, mask, conv_cache, kv_cache):
        """The estimator on [B,80,T] inputs with stacked caches ([depth,B,2H,2], [depth,B,h,C,2hd]) -> v [B,80,T],
        new conv caches, new K/V rows [depth,B,h,T,2hd]."""
        T = x.shape[-1]
        c = self.t_embedder.mlp(t_freq)[:, None]
        h = torch.cat((x, mu, spks[:, :, None].expand(-1, -1, T), cond), dim=1).transpose(1, 2)
        h = self.in_proj(h)
        convs, kvs = [], []
        for i, blk in enumerate(self.blocks):
            h, cc, kv = blk(h, c, mask, conv_cache[i], kv_cache[i])
            convs.append(cc)
            kvs.append(kv)
        return self.final_layer(h, c).transpose(1, 2), torch.stack(convs), torch.stack(kvs)

    def empty_caches(self, batch: int, dtype=torch.float32):
        c = self.config
        return (torch.zeros(c.depth, batch, 2 * c.hidden, 2, dtype=dtype),
                torch.zeros(c.depth, batch, c.heads, 0, 2 * c.head_dim, dtype=dtype))

    def full(self, x, mu, t_freq, spks, cond, mask):
        """The whole utterance at once: ``mask`` [T,T] additive (which frames each frame attends to)."""
        conv, kv = self.empty_caches(x.shape[0], x.dtype)
        return self.run(x, mu, t_freq, spks, cond, mask[None, None], conv, kv)[0]


class DiTStep(nn.Module):
    """One estimator call on a chunk of N frames for the CFG batch (row 0 conditional, row 1 unconditional) over a
    fixed-size attention cache of C rows.

    Inputs: ``x``, ``mu``, ``cond`` [2,80,N]; ``t_freq`` [2,freq] (``timestep_freq``); ``spks`` [2,80]; ``mask``
    [1,1,1,N+C] additive (0 for the chunk and the valid cache rows); ``conv_cache`` [depth,2,2H,2]; ``kv_cache``
    [depth,2,h,C,2hd]. Outputs: ``v`` [2,80,N], ``conv_new`` [depth,2,2H,2], ``kv_new`` [depth,2,h,N,2hd] (the
    host concatenates them before the cache, upstream's order, and trims)."""

    def __init__(self, dit: DiT):
        super().__init__()
        self.dit = dit

    def forward(self, x, mu, cond, t_freq, spks, mask, conv_cache, kv_cache):
        return self.dit.run(x, mu, t_freq, spks, cond, mask, conv_cache, kv_cache)
