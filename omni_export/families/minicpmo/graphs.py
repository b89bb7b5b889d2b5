"""The MiniCPM-o speech graphs with their IO specs (names and shapes the host loops feed), and an eager runner.

- ``dit_step``: one DiT estimator call on a chunk of the CFG batch with the per-step caches (``dit.DiTStep``);
- ``encoder_chunk``: 25 + 3 tokens -> 50 mel frames of ``mu`` with carried caches (``encoder.EncoderChunk``);
- ``hift_window`` / ``f0_window``: HiFT and its F0 predictor on fixed windows (``hift_host``).
"""
from __future__ import annotations

import numpy as np
import torch

from ...components.base import Graph, TensorSpec
from .dit import DiTStep
from .encoder import EncoderChunk
from .hift import F0Graph, HiFTDecode


def _graph(name, module, ins, outs) -> Graph:
    return Graph(name, module.eval(), tuple(TensorSpec(n, tuple(s)) for n, s in ins),
                 tuple(TensorSpec(n, tuple(s)) for n, s in outs))


def dit_step(model, frames: int, cache: int) -> Graph:
    c = model.config.dit
    conv, kv = (c.depth, 2, 2 * c.hidden, 2), (c.depth, 2, c.heads, cache, 2 * c.head_dim)
    ins = [("x", (2, 80, frames)), ("mu", (2, 80, frames)), ("cond", (2, 80, frames)), ("t_freq", (2, c.freq_dim)),
           ("spks", (2, 80)), ("mask", (1, 1, 1, frames + cache)), ("conv_cache", conv), ("kv_cache", kv)]
    outs = [("v", (2, 80, frames)), ("conv_new", conv), ("kv_new", kv[:3] + (frames, kv[4]))]
    return _graph(f"dit_step_{frames}", DiTStep(model.flow.decoder.estimator), ins, outs)


def encoder_chunk(model, tokens: int, cache1: int) -> Graph:
    e = model.config.encoder
    up, dk, S = e.up_stride, e.hidden // e.heads, tokens
    a1, a2 = (e.num_blocks, 1, e.heads, cache1, 2 * dk), (e.num_up_blocks, 1, e.heads, up * cache1, 2 * dk)
    cnn = (1, e.hidden, 2 + 2 * up)
    ins = [("emb", (1, S + e.pre_lookahead_len, e.hidden)), ("valid", (1, S + e.pre_lookahead_len, 1)),
           ("cnn_cache", cnn), ("att1", a1), ("att2", a2), ("mask1", (1, 1, 1, cache1 + S)),
           ("mask2", (1, 1, 1, up * (cache1 + S)))]
    outs = [("mu", (1, e.mel, up * S)), ("cnn_new", cnn), ("att1_new", a1[:3] + (S, a1[4])),
            ("att2_new", a2[:3] + (up * S, a2[4]))]
    return _graph(f"encoder_chunk_{S}", EncoderChunk(model.flow, S, cache1), ins, outs)


def hift_window(model, frames: int) -> Graph:
    c = model.config.hift
    n = frames * c.samples_per_frame
    return _graph(f"hift_{frames}", HiFTDecode(model.hift), [("mel", (1, c.mel, frames)),
                                                              ("harmonics", (1, c.nb_harmonics + 1, n))],
                  [("audio_window", (1, n))])


def f0_window(model, frames: int) -> Graph:
    return _graph(f"f0_{frames}", F0Graph(model.hift), [("mel", (1, model.config.hift.mel, frames))],
                  [("f0", (1, frames))])


def eager(graph: Graph):
    """A runner (feed dict -> list of numpy outputs) of the graph's module in fp32."""
    names = [s.name for s in graph.inputs]

    @torch.no_grad()
    def run(feed):
        return [o.numpy() for o in graph.module(*(torch.from_numpy(np.ascontiguousarray(feed[n])) for n in names))]
    return run
