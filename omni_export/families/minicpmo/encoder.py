"""The flow's token encoder (stepaudio2 ``UpsampleConformerEncoderV2`` with the flow's ``input_embedding``,
``spk_embed_affine_layer`` and ``encoder_proj``); parameter names are the official ``flow.pt`` keys.

Linear + LayerNorm, x * sqrt(D) with ESPnet relative positions, the look-ahead layer (conv k=4 over 3 future
tokens, LeakyReLU, causal conv k=3, residual), Conformer layers at 25 Hz (rel-pos MHA with ``pos_bias_u/v``,
pre-LN eps 1e-12, SiLU FFN), nearest x2 + causal conv k=5, Conformer layers at 50 Hz, ``after_norm``, projection
to the 80-d ``mu``.

Relative positions are indices in the key list [cache, chunk], as upstream's ``forward_chunk`` computes them
(after cache trimming they are no longer time differences: reproduced, not corrected). ``full`` takes them as an
explicit [T,T] matrix beside the mask; ``EncoderChunk`` keeps a fixed-size, right-aligned cache, so the valid rows
sit where upstream's would and its position table is a constant of the shapes.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import EncoderConfig


def rel_pos_table(d_model: int, size: int) -> np.ndarray:
    """ESPnet's relative table for ``size`` keys: 2*size-1 rows, relative positions size-1 .. -(size-1), fp64."""
    pos = np.arange(size, dtype=np.float64)[:, None]
    div = np.exp(np.arange(0, d_model, 2, dtype=np.float64) * -(math.log(10000.0) / d_model))
    pe = np.zeros((2 * size - 1, d_model))
    pe[:size, 0::2], pe[:size, 1::2] = np.sin(pos * div)[::-1], np.cos(pos * div)[::-1]
    pe[size:, 0::2], pe[size:, 1::2] = np.sin(-pos[1:] * div), np.cos(-pos[1:] * div)
    return pe


def rel_shift(x):
    """[B,h,S,2T-1] (key-side relative rows) -> [B,h,S,T]: entry (i, j) is relative position (T - S) + i - j."""
    B, h, S, P = x.shape
    x = torch.cat((torch.zeros(B, h, S, 1, dtype=x.dtype), x), dim=-1).view(B, h, P + 1, S)
    return x[:, :, 1:].reshape(B, h, S, P)[:, :, :, : P // 2 + 1]


class RelAttention(nn.Module):
    def __init__(self, c: EncoderConfig):
        super().__init__()
        D, self.h, self.dk = c.hidden, c.heads, c.hidden // c.heads
        self.linear_q, self.linear_k, self.linear_v, self.linear_out = (nn.Linear(D, D) for _ in range(4))
        self.linear_pos = nn.Linear(D, D, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(self.h, self.dk))
        self.pos_bias_v = nn.Parameter(torch.zeros(self.h, self.dk))

    def split(self, lin, x):
        B, T, _ = x.shape
        return lin(x).view(B, T, self.h, self.dk)

    def forward(self, x, cache, pos, mask, rel_index=None):
        """x [B,S,D]; cache [B,h,C,2dk]; pos [2(C+S)-1,D] table; mask additive [.,.,S,C+S]; ``rel_index``
        [S,C+S] rows of ``pos`` per (query, key) (None: upstream's rel_shift) -> out, new K/V rows [B,h,S,2dk]."""
        B, S, _ = x.shape
        q = self.split(self.linear_q, x)
        k, v = (self.split(f, x).transpose(1, 2) for f in (self.linear_k, self.linear_v))
        keys = torch.cat((cache[..., : self.dk], k), dim=2)
        vals = torch.cat((cache[..., self.dk:], v), dim=2)
        p = self.linear_pos(pos).view(1, -1, self.h, self.dk).transpose(1, 2)
        ac = torch.matmul((q + self.pos_bias_u).transpose(1, 2), keys.transpose(-2, -1))
        bd = torch.matmul((q + self.pos_bias_v).transpose(1, 2), p.transpose(-2, -1))
        bd = rel_shift(bd) if rel_index is None else torch.gather(bd, 3, rel_index.expand(B, self.h, -1, -1))
        att = torch.softmax((ac + bd) / math.sqrt(self.dk) + mask, dim=-1)
        o = torch.matmul(att, vals).transpose(1, 2).reshape(B, S, self.h * self.dk)
        return self.linear_out(o), torch.cat((k, v), dim=-1)


class ConformerLayer(nn.Module):
    def __init__(self, c: EncoderConfig):
        super().__init__()
        self.self_attn = RelAttention(c)
        self.feed_forward = nn.Module()
        self.feed_forward.w_1 = nn.Linear(c.hidden, c.linear_units)
        self.feed_forward.w_2 = nn.Linear(c.linear_units, c.hidden)
        self.norm_ff = nn.LayerNorm(c.hidden, eps=1e-12)
        self.norm_mha = nn.LayerNorm(c.hidden, eps=1e-12)

    def forward(self, x, cache, pos, mask, rel_index=None):
        a, kv = self.self_attn(self.norm_mha(x), cache, pos, mask, rel_index)
        x = x + a
        ff = self.feed_forward
        return x + ff.w_2(F.silu(ff.w_1(self.norm_ff(x)))), kv


class Embed(nn.Module):
    """``LinearNoSubsampling``: ``out`` = [Linear, LayerNorm(eps 1e-5), Dropout]; then x * sqrt(D)."""

    def __init__(self, c: EncoderConfig):
        super().__init__()
        self.out = nn.Sequential(nn.Linear(c.hidden, c.hidden), nn.LayerNorm(c.hidden, eps=1e-5), nn.Identity())
        self.xscale = math.sqrt(c.hidden)

    def forward(self, x):
        return self.out(x) * self.xscale


class PreLookahead(nn.Module):
    def __init__(self, c: EncoderConfig):
        super().__init__()
        self.len = c.pre_lookahead_len
        self.conv1 = nn.Conv1d(c.hidden, c.hidden, c.pre_lookahead_len + 1)
        self.conv2 = nn.Conv1d(c.hidden, c.hidden, 3)

    def look(self, x):
        """x [B,S+len,D] -> LeakyReLU(conv1) [B,D,S] (the look-ahead part, stateless)."""
        return F.leaky_relu(self.conv1(x.transpose(1, 2)))

    def tail(self, x, h, cache):
        """Causal conv2 over [cache, h] + residual; cache [B,D,2] -> out [B,S,D], new cache."""
        hh = torch.cat((cache, h), dim=2)
        return self.conv2(hh).transpose(1, 2) + x[:, : h.shape[-1]], hh[..., hh.shape[-1] - 2:]


class Upsample(nn.Module):
    def __init__(self, c: EncoderConfig):
        super().__init__()
        self.stride = c.up_stride
        self.conv = nn.Conv1d(c.hidden, c.hidden, 2 * c.up_stride + 1)

    def step(self, x, cache):
        """x [B,D,S] -> nearest x2 then causal conv over [cache, up]; cache [B,D,2*stride]."""
        B, D, S = x.shape
        up = x[..., None].expand(B, D, S, self.stride).reshape(B, D, S * self.stride)
        u = torch.cat((cache, up), dim=2)
        return self.conv(u), u[..., u.shape[-1] - 2 * self.stride:]


class ConformerEncoder(nn.Module):
    def __init__(self, c: EncoderConfig):
        super().__init__()
        self.config = c
        self.embed = Embed(c)
        self.pre_lookahead_layer = PreLookahead(c)
        self.encoders = nn.ModuleList(ConformerLayer(c) for _ in range(c.num_blocks))
        self.up_layer = Upsample(c)
        self.up_embed = Embed(c)
        self.up_encoders = nn.ModuleList(ConformerLayer(c) for _ in range(c.num_up_blocks))
        self.after_norm = nn.LayerNorm(c.hidden, eps=1e-5)


class Flow(nn.Module):
    """The flow (``flow.pt``): token embedding, speaker affine, encoder, projection, and ``decoder.estimator``."""

    def __init__(self, c: EncoderConfig, estimator: nn.Module):
        super().__init__()
        self.config = c
        self.input_embedding = nn.Embedding(c.vocab_size, c.hidden)
        self.spk_embed_affine_layer = nn.Linear(c.spk_embed_dim, c.mel)
        self.encoder = ConformerEncoder(c)
        self.encoder_proj = nn.Linear(c.hidden, c.mel)
        self.decoder = nn.Module()
        self.decoder.estimator = estimator

    def spk(self, xvec):
        """[B,192] x-vector -> [B,80]: L2-normalised, then the affine layer."""
        return self.spk_embed_affine_layer(F.normalize(xvec, dim=1))

    def stack(self, layers, x, caches, pos, mask, rel_index=None):
        new = []
        for i, layer in enumerate(layers):
            x, kv = layer(x, caches[i], pos, mask, rel_index)
            new.append(kv)
        return x, torch.stack(new)

    def full(self, emb, look, masks, rels):
        """The whole utterance: ``emb`` [1,T,D] gathered token embeddings, ``look`` [1,D,T] the look-ahead conv
        outputs each chunk saw (``look_rows``), ``masks``/``rels``: (token-rate, mel-rate) [T,T] / [2T,2T] additive
        masks and relative-position rows -> mu [1,80,2T]."""
        e = self.encoder
        c = self.config
        x = e.embed(emb)
        x, _ = e.pre_lookahead_layer.tail(x, look, torch.zeros(1, c.hidden, 2, dtype=x.dtype))
        x = self._stage(e.encoders, x, masks[0], rels[0])
        x, _ = e.up_layer.step(x.transpose(1, 2), torch.zeros(1, c.hidden, 2 * c.up_stride, dtype=x.dtype))
        x = self._stage(e.up_encoders, e.up_embed(x.transpose(1, 2)), masks[1], rels[1])
        return self.encoder_proj(e.after_norm(x)).transpose(1, 2)

    def _stage(self, layers, x, mask, rel):
        T = x.shape[1]
        pos = torch.from_numpy(rel_pos_table(self.config.hidden, T)).to(x.dtype)
        idx = (T - 1 - rel).clamp(0, 2 * T - 2)[None, None]
        empty = torch.zeros(1, self.config.heads, 0, 2 * (self.config.hidden // self.config.heads), dtype=x.dtype)
        return self.stack(layers, x, [empty] * len(layers), pos, mask[None, None], idx)[0]


class EncoderChunk(nn.Module):
    """One chunk of S new tokens (+ look-ahead) over fixed-size caches (C1 token-rate rows, C2 = 2*C1 mel-rate).

    Inputs: ``emb`` [1,S+3,D] (token embeddings gathered on the host), ``valid`` [1,S+3,1] (0 for the zero rows
    that pad the last chunk: upstream pads after ``embed``), ``cnn_cache`` [1,D,6] (look-ahead conv2 tail, then the
    upsample conv tail: upstream's packing), ``att1`` [L1,1,h,C1,2dk], ``att2`` [L2,1,h,C2,2dk] (right-aligned),
    ``mask1`` [1,1,1,C1+S], ``mask2`` [1,1,1,C2+2S]. Outputs: ``mu`` [1,80,2S], ``cnn_new``, ``att1_new``
    [L1,1,h,S,2dk], ``att2_new`` [L2,1,h,2S,2dk]."""

    def __init__(self, flow: Flow, tokens: int, cache1: int):
        super().__init__()
        self.flow, self.S, self.C1 = flow, tokens, cache1
        c = flow.config
        up = c.up_stride
        self.register_buffer("pos1", torch.from_numpy(rel_pos_table(c.hidden, cache1 + tokens)).float(), False)
        self.register_buffer("pos2", torch.from_numpy(rel_pos_table(c.hidden, up * (cache1 + tokens))).float(), False)

    def forward(self, emb, valid, cnn_cache, att1, att2, mask1, mask2):
        f, e = self.flow, self.flow.encoder
        x = e.embed(emb) * valid
        h = e.pre_lookahead_layer.look(x)
        x, pre_new = e.pre_lookahead_layer.tail(x, h, cnn_cache[..., :2])
        x, att1_new = f.stack(e.encoders, x, att1, self.pos1, mask1)
        x, up_new = e.up_layer.step(x.transpose(1, 2), cnn_cache[..., 2:])
        x, att2_new = f.stack(e.up_encoders, e.up_embed(x.transpose(1, 2)), att2, self.pos2, mask2)
        mu = f.encoder_proj(e.after_norm(x)).transpose(1, 2)
        return mu, torch.cat((pre_new, up_new), dim=2), att1_new, att2_new
