"""The flow's host loop: chunk schedule, cache bookkeeping with upstream's trimming, seeded noise, the 10-step Euler
ODE with classifier-free guidance; the same loop drives every runtime (eager, ORT, a simulator).

Upstream (``stepaudio2.token2wav.Token2wav.stream`` of minicpmo-utils 1.0.7; 1.0.5 appended three silence tokens as
the prompt's look-ahead and trimmed the conformer caches as one packed tensor, which 1.0.7 fixed) keeps, after each chunk, the conformer caches as
[first P, last 100] mel frames ([first P/2, last 50] tokens) and the estimator K/V as ``att[:P] ++ att[-100:]``
of a list ordered [newest chunk, ..., oldest]: i.e. the newest P frames and the prompt's last 100 (P: prompt mel
frames). Its noise is ``rand_noise[offset: offset + N]`` with offset = the trimmed estimator cache length, so once
trimming starts every chunk draws the same slice. Both are reproduced: the host tracks which frame each cache row
holds (``ids``), and ``full_decode`` turns the same bookkeeping into whole-utterance masks.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ...blocks.layers import MASK_VALUE
from .dit import timestep_freq

NEG = -1e30  # masked entries of the fp64 whole-utterance reference (exact zeros after softmax)


def t_span(n: int) -> np.ndarray:
    """Cosine schedule ``1 - cos(linspace(0,1,n+1) * pi/2)`` (fp64)."""
    return 1.0 - np.cos(np.linspace(0.0, 1.0, n + 1) * 0.5 * np.pi)


def euler_steps(n: int):
    """(t, dt) of each Euler step as upstream's recursion takes them."""
    ts = t_span(n)
    t, dt, out = ts[0], ts[1] - ts[0], []
    for step in range(1, n + 1):
        out.append((t, dt))
        t = t + dt
        if step < n:
            dt = ts[step + 1] - t
    return out


@dataclass
class Chunk:
    tokens: np.ndarray       # [S] new tokens
    look: np.ndarray         # [3] look-ahead tokens (real next tokens, the prompt's first 3 for the prompt chunk)
    n_look: int              # how many look-ahead rows are real (the rest are zero rows: last chunk)


def schedule(prompt: np.ndarray, tokens: np.ndarray, chunk: int, look: int = 3) -> list[Chunk]:
    """The prompt as one chunk (look-ahead: its own first tokens, as 1.0.7's ``set_stream_cache``), then ``chunk`` new tokens
    with the next ``look`` as look-ahead; the last chunk pads zero rows."""
    out = [Chunk(prompt, prompt[:look], look)] if len(prompt) else []
    for s in range(0, len(tokens), chunk):
        nxt = tokens[s + chunk: s + chunk + look]
        out.append(Chunk(tokens[s: s + chunk], nxt, len(nxt)))
    return out


class FlowHost:
    """``prompt_frames`` P (even): the prompt's mel frames; caches are capped at P + history (mel rate)."""

    def __init__(self, flow, cfg, prompt_frames: int):
        self.flow, self.cfg, self.P = flow, cfg, prompt_frames
        e = cfg.encoder
        self.hist = cfg.history_frames
        self.cap2 = prompt_frames + self.hist
        self.cap1 = self.cap2 // e.up_stride
        self.look = e.pre_lookahead_len

    # -- cache bookkeeping (frame ids) -------------------------------------------------------------
    def trim_encoder(self, ids1: list, ids2: list):
        if len(ids2) > self.cap2:
            ids1 = ids1[: self.P // 2] + ids1[len(ids1) - self.hist // 2:]
            ids2 = ids2[: self.P] + ids2[len(ids2) - self.hist:]
        return ids1, ids2

    def trim_dit(self, ids: list):
        return ids[: self.P] + ids[len(ids) - self.hist:] if len(ids) > self.cap2 else ids

    # -- encoder ------------------------------------------------------------------------------------
    def embed_rows(self, ch: Chunk, S: int) -> tuple[np.ndarray, np.ndarray]:
        """[1,S+3,D] gathered embeddings and the [1,S+3,1] validity of a chunk padded to S new tokens."""
        ids = np.zeros(S + self.look, np.int64)
        valid = np.zeros((1, S + self.look, 1), np.float32)
        n = len(ch.tokens)
        ids[:n], valid[0, :n] = ch.tokens, 1.0
        ids[n: n + ch.n_look], valid[0, n: n + ch.n_look] = ch.look[: ch.n_look], 1.0
        W = self.flow.input_embedding.weight.detach().numpy()
        return W[ids][None].astype(np.float32), valid

    def encode_stream(self, runs: dict, chunks: list[Chunk], record=None, outputs=None):
        """``runs``: new tokens per chunk -> runner of ``EncoderChunk``. Returns mu per chunk ([80, valid frames])
        and the cache ids each chunk saw (token rate, mel rate). ``record(feed)`` / ``outputs(S, outs)`` see every
        call's inputs / outputs."""
        e, up = self.cfg.encoder, self.cfg.encoder.up_stride
        L1, L2, h, dk = e.num_blocks, e.num_up_blocks, e.heads, e.hidden // e.heads
        a1, a2 = np.zeros((L1, 1, h, 0, 2 * dk), np.float32), np.zeros((L2, 1, h, 0, 2 * dk), np.float32)
        cnn = np.zeros((1, e.hidden, 2 + 2 * up), np.float32)
        ids1, ids2, t0, mus, seen = [], [], 0, [], []
        for ch in chunks:
            S = len(ch.tokens) if not seen and self.P else self.cfg.chunk_tokens
            emb, valid = self.embed_rows(ch, S)
            n = len(ch.tokens)
            feed = {"emb": emb, "valid": valid, "cnn_cache": cnn,
                    "att1": _right(a1, self.cap1), "att2": _right(a2, self.cap2),
                    "mask1": _key_mask(a1.shape[3], self.cap1, n, S), "mask2": _key_mask(a2.shape[3], self.cap2,
                                                                                       up * n, up * S)}
            if record is not None:
                record(feed)
            got = runs[S](feed)
            if outputs is not None:
                outputs(S, got)
            mu, cnn, n1, n2 = got
            seen.append((list(ids1), list(ids2)))
            a1 = np.concatenate((a1, n1[:, :, :, :n]), axis=3)
            a2 = np.concatenate((a2, n2[:, :, :, : up * n]), axis=3)
            ids1 += list(range(t0, t0 + n))
            ids2 += list(range(up * t0, up * (t0 + n)))
            k1, k2 = self.trim_encoder(list(range(len(ids1))), list(range(len(ids2))))
            a1, a2, ids1, ids2 = a1[:, :, :, k1], a2[:, :, :, k2], [ids1[i] for i in k1], [ids2[i] for i in k2]
            mus.append(mu[0, :, : up * n])
            t0 += n
        return mus, seen

    def encode_full(self, chunks: list[Chunk], seen, flow=None, dtype=torch.float64) -> np.ndarray:
        """The whole utterance through ``Flow.full`` with the masks and relative positions the stream had."""
        flow = flow or self.flow
        up = self.cfg.encoder.up_stride
        W = flow.input_embedding.weight
        n_tok = sum(len(c.tokens) for c in chunks)
        looks, t0 = [], 0
        blocks1, blocks2 = [], []
        with torch.no_grad():
            for ch, (s1, s2) in zip(chunks, seen):
                n = len(ch.tokens)
                emb, valid = self.embed_rows(ch, n)
                rows = torch.cat((W[torch.from_numpy(ch.tokens)], W[torch.from_numpy(ch.look[: ch.n_look])],
                                  torch.zeros(self.look - ch.n_look, W.shape[1], dtype=W.dtype)))[None]
                x = flow.encoder.embed(rows) * torch.from_numpy(valid).to(dtype)
                looks.append(flow.encoder.pre_lookahead_layer.look(x))
                blocks1.append((s1, list(range(t0, t0 + n))))
                blocks2.append((s2, list(range(up * t0, up * (t0 + n)))))
                t0 += n
            emb = W[torch.from_numpy(np.concatenate([c.tokens for c in chunks]))][None]
            m1, r1 = _block_mask(blocks1, n_tok)
            m2, r2 = _block_mask(blocks2, up * n_tok)
            return flow.full(emb, torch.cat(looks, dim=2), (m1.to(dtype), m2.to(dtype)), (r1, r2))[0].numpy()

    # -- DiT ----------------------------------------------------------------------------------------
    def dit_stream(self, run, mus: list, spk: np.ndarray, prompt_mel: np.ndarray, noise: np.ndarray, record=None,
                   outputs=None):
        """The Euler/CFG loop chunk by chunk. ``mus``: [80, n] per chunk (the first is the prompt's when P > 0);
        ``spk`` [80] (after the affine layer); ``prompt_mel`` [80, P]; ``noise`` [80, >= P + hist + chunk]. ``run``:
        frames -> runner of ``DiTStep``. Returns mel per chunk and the estimator cache ids each chunk saw; ``record``
        / ``outputs`` as ``encode_stream``."""
        c, N = self.cfg.dit, self.cfg.chunk_frames
        steps = euler_steps(self.cfg.n_timesteps)
        kv = [np.zeros((c.depth, 2, c.heads, 0, 2 * c.head_dim), np.float32) for _ in steps]
        conv = [np.zeros((c.depth, 2, 2 * c.hidden, 2), np.float32) for _ in steps]
        ids, f0, mels, seen, cap = [], 0, [], [], self.cap2
        spks = np.stack([spk, np.zeros_like(spk)]).astype(np.float32)
        for k, mu in enumerate(mus):
            n = mu.shape[1]
            F = n if (k == 0 and self.P) else N
            off = len(ids)
            x = _pad(noise[:, off: off + n], F)
            cond = _pad(prompt_mel, F) if (k == 0 and self.P) else np.zeros((80, F), np.float32)
            mu_in = np.stack([_pad(mu, F), np.zeros((80, F), np.float32)])
            cond_in = np.stack([cond, np.zeros_like(cond)])
            mask = np.full((1, 1, 1, F + cap), MASK_VALUE, np.float32)
            mask[..., :n] = 0.0
            mask[..., F: F + off] = 0.0
            for s, (t, dt) in enumerate(steps):
                feed = {"x": np.stack([x, x]).astype(np.float32), "mu": mu_in.astype(np.float32), "cond": cond_in,
                        "t_freq": timestep_freq(np.array([t, t]), c.freq_dim).astype(np.float32), "spks": spks,
                        "mask": mask, "conv_cache": conv[s], "kv_cache": _pad(kv[s], cap, axis=3)}
                if record is not None:
                    record(feed)
                got = run[F](feed)
                if outputs is not None:
                    outputs(F, got)
                v, conv[s], new = got
                v = (1.0 + self.cfg.cfg_rate) * v[0] - self.cfg.cfg_rate * v[1]
                x = (x + np.float32(dt) * v).astype(np.float32)
                kv[s] = np.concatenate((new[:, :, :, :n], kv[s]), axis=3)
            seen.append(list(ids))
            ids = list(range(f0, f0 + n)) + ids
            keep = self.trim_dit(list(range(len(ids))))
            ids = [ids[i] for i in keep]
            kv = [a[:, :, :, keep] for a in kv]
            mels.append(x[:, :n])
            f0 += n
        return mels, seen

    def dit_full(self, dit, mu: np.ndarray, spk: np.ndarray, prompt_mel: np.ndarray, noise: np.ndarray, sizes,
                 seen, dtype=torch.float64) -> np.ndarray:
        """The whole-utterance ODE: every step runs the estimator over all frames with the stream's block masks;
        the noise is the slices the stream drew. Returns mel [80, T]."""
        c = self.cfg.dit
        T = mu.shape[1]
        blocks, f0, z = [], 0, []
        for n, ids in zip(sizes, seen):
            blocks.append((ids, list(range(f0, f0 + n))))
            z.append(noise[:, len(ids): len(ids) + n])
            f0 += n
        mask = _block_mask(blocks, T)[0].to(dtype)
        x = torch.from_numpy(np.concatenate(z, axis=1)).to(dtype)[None]
        P = prompt_mel.shape[1]
        cond = torch.zeros(1, 80, T, dtype=dtype)
        cond[0, :, :P] = torch.from_numpy(prompt_mel).to(dtype)
        zero = lambda a: torch.cat((a, torch.zeros_like(a)))  # noqa: E731
        mu_in, cond_in = zero(torch.from_numpy(mu).to(dtype)[None]), zero(cond)
        spks = zero(torch.from_numpy(spk).to(dtype)[None])
        with torch.no_grad():
            for t, dt in euler_steps(self.cfg.n_timesteps):
                tf = torch.from_numpy(timestep_freq(np.array([t, t]), c.freq_dim)).to(dtype)
                v = dit.full(torch.cat((x, x)), mu_in, tf, spks, cond_in, mask)
                x = x + dt * ((1.0 + self.cfg.cfg_rate) * v[:1] - self.cfg.cfg_rate * v[1:])
        return x[0].numpy()


def _pad(a: np.ndarray, n: int, axis: int = -1) -> np.ndarray:
    w = [(0, 0)] * a.ndim
    w[axis] = (0, n - a.shape[axis])
    return np.pad(a, w).astype(np.float32)


def _right(a: np.ndarray, cap: int) -> np.ndarray:
    """Right-align a [L,1,h,C,2dk] cache in ``cap`` rows (zeros before it)."""
    w = [(0, 0)] * a.ndim
    w[3] = (cap - a.shape[3], 0)
    return np.pad(a, w).astype(np.float32)


def _key_mask(valid_cache: int, cap: int, n: int, S: int) -> np.ndarray:
    m = np.full((1, 1, 1, cap + S), MASK_VALUE, np.float32)
    m[..., cap - valid_cache: cap + n] = 0.0
    return m


def _block_mask(blocks, T: int):
    """``blocks``: (cache ids seen, own ids) per chunk -> additive mask [T,T] and list-position relative indices."""
    mask = torch.full((T, T), NEG, dtype=torch.float64)
    rel = torch.zeros((T, T), dtype=torch.int64)
    for cache, own in blocks:
        keys = list(cache) + list(own)
        for i, q in enumerate(own):
            mask[q, keys] = 0.0
            rel[q, keys] = torch.tensor([len(cache) + i - m for m in range(len(keys))])
    return mask, rel
