"""Qwen3-TTS host loops: the one driver every runtime (eager, ORT, the HTP simulator) is run by.

The host gathers embeddings (text embedding + text projection, codec tables, the decoder's folded codebooks),
computes RoPE tables and additive masks in fp32, keeps the caches and conv tails, and writes back the new rows
the graphs return. ``Pipeline`` runs talker -> code predictor -> Code2Wav for one text with any set of runners.

Prompt layout (simplified, structurally the official one): a 3-row prefix (codec ids pad, pad, bos summed with
the first text rows), then one row per frame: C(c0) + sum_j predictor_table[j-1](c_j) + the next projected text
row (the projected tts_pad once the text runs out). Greedy everywhere (argmax; the one-call frame graph, the code
predictor ``generate`` uses by default, takes the top code at host uniforms of 0), so parity runs are reproducible.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch

from ...blocks.layers import MASK_VALUE, rope_table
from .config import CODEC_BOS, CODEC_PAD, TEXT_PAD
from .graphs import Code2WavChunk, PredictorFrame, PredictorStep, PredictorWindow, TalkerStep

PREFIX = (CODEC_PAD, CODEC_PAD, CODEC_BOS)
FIRST_CHUNK, CHUNK = 1, 25       # the serving schedule: a 1-frame first chunk, then 25-frame chunks


def _eager(module, names):
    @torch.no_grad()
    def run(feed):
        return [o.numpy() for o in module(*(torch.from_numpy(np.ascontiguousarray(feed[n])) for n in names))]
    return run


@dataclass
class Utterance:
    """What the fp32 pipeline produced for one text."""
    text_ids: list[int]
    talker_embeds: np.ndarray    # [steps, H] every talker input row fed
    hidden: np.ndarray           # [frames, H] talker final-norm state that seeded each frame
    codes: np.ndarray            # [frames, 16]


class TTSHost:
    def __init__(self, bundle, context: int):
        m, cfg = bundle.module, bundle.config
        self.cfg, self.context = cfg, context
        tk = m.talker
        with torch.no_grad():
            self.text_rows = tk.text_projection(tk.model.text_embedding.weight).numpy()   # [text_vocab, H]
            self.codec = tk.model.codec_embedding.weight.numpy()
            self.pred_tables = np.stack([e.weight.numpy() for e in tk.code_predictor.model.codec_embedding])
            self.dec_tables = m.speech_tokenizer.decoder.quantizer.tables().numpy()        # [16, 2048, cbd]
        self.tokenizer = bundle.tokenizer
        self.talker_graph = TalkerStep(tk).eval()
        self.pred_graph = PredictorStep(tk.code_predictor).eval()
        self.window_graph = PredictorWindow(tk.code_predictor).eval()
        self.frame_graph = PredictorFrame(tk.code_predictor).eval()
        self.dec = m.speech_tokenizer.decoder
        self.chunk_graphs = {n: Code2WavChunk(self.dec, n).eval() for n in (FIRST_CHUNK, CHUNK)}
        t, p = cfg.talker, cfg.predictor
        self.t_rope = rope_table(t.inv_freq(), np.arange(context))
        self.p_rope = rope_table(p.inv_freq(), np.arange(cfg.num_code_groups))
        self._memo: dict = {}

    # -- talker ------------------------------------------------------------------------------------
    def talker_names(self):
        t = self.cfg.talker
        ins = ["embeds", "cos", "sin", "mask"] + [f"{kv}_cache_{i}" for i in range(t.num_hidden_layers) for kv in "kv"]
        return ins

    def talker_caches(self):
        t = self.cfg.talker
        shape = (1, t.num_key_value_heads, self.context, t.head_dim)
        return {f"{kv}_cache_{i}": np.zeros(shape, np.float32) for i in range(t.num_hidden_layers) for kv in "kv"}

    def talker_feed(self, caches, embeds, pos):
        if not 0 <= pos < self.context:
            raise ValueError(f"talker position {pos} outside the context length {self.context}")
        mask = np.full((1, 1, 1, self.context + 1), MASK_VALUE, np.float32)
        mask[..., :pos] = 0.0
        mask[..., -1] = 0.0
        return {"embeds": embeds.reshape(1, 1, -1).astype(np.float32), "cos": self.t_rope[0][pos][None, None, None],
                "sin": self.t_rope[1][pos][None, None, None], "mask": mask, **caches}

    def talker_write(self, caches, outs, pos):
        for i in range(self.cfg.talker.num_hidden_layers):
            caches[f"k_cache_{i}"][:, :, pos] = outs[2 + 2 * i][:, :, 0]
            caches[f"v_cache_{i}"][:, :, pos] = outs[3 + 2 * i][:, :, 0]

    def text_row(self, ids, t):
        return self.text_rows[ids[t] if t < len(ids) else TEXT_PAD]

    def frame_embed(self, codes, ids, t):
        row = self.codec[codes[0]] + self.text_row(ids, t)
        for j in range(1, self.cfg.num_code_groups):
            row = row + self.pred_tables[j - 1][codes[j]]
        return row

    # -- code predictor: KV-cached step graph ---------------------------------------------------------
    def pred_caches(self):
        p = self.cfg.predictor
        shape = (1, p.num_key_value_heads, self.cfg.num_code_groups - 1, p.head_dim)
        return {f"{kv}_cache_{i}": np.zeros(shape, np.float32) for i in range(p.num_hidden_layers) for kv in "kv"}

    def pred_feed(self, caches, embeds, pos):
        G = self.cfg.num_code_groups
        mask = np.full((1, 1, 1, G), MASK_VALUE, np.float32)
        mask[..., :pos] = 0.0
        mask[..., -1] = 0.0
        head = np.zeros((1, 1, G - 1), np.float32)
        if pos >= 1:
            head[..., pos - 1] = 1.0
        return {"embeds": embeds.reshape(1, 1, -1).astype(np.float32), "cos": self.p_rope[0][pos][None, None, None],
                "sin": self.p_rope[1][pos][None, None, None], "mask": mask, "head": head, **caches}

    def pred_frame(self, run, hidden, c0, forced=None, record=None):
        """16 graph calls for one frame -> (logits [16,1,1,V], all outputs per call, codes c1..c15).

        ``forced`` (codes c1..c15) teacher-forces the inputs; otherwise the graph's own greedy codes are fed."""
        caches, outs, codes = self.pred_caches(), [], []
        G = self.cfg.num_code_groups
        for pos in range(G):
            if pos == 0:
                e = hidden
            elif pos == 1:
                e = self.codec[c0]
            else:
                prev = forced[pos - 2] if forced is not None else codes[-1]
                e = self.pred_tables[pos - 2][prev]
            f = self.pred_feed(caches, e, pos)
            if record is not None:
                record(f)
            o = run(f)
            for i in range(self.cfg.predictor.num_hidden_layers):
                if pos < G - 1:
                    caches[f"k_cache_{i}"][:, :, pos] = o[1 + 2 * i][:, :, 0]
                    caches[f"v_cache_{i}"][:, :, pos] = o[2 + 2 * i][:, :, 0]
            outs.append(o)
            if pos >= 1:
                codes.append(int(np.argmax(o[0].reshape(-1))))
        return outs, codes

    # -- code predictor: 16-slot window graph ----------------------------------------------------------
    def window_feed(self, slots, k):
        G = self.cfg.num_code_groups
        i, j = np.meshgrid(np.arange(G), np.arange(G), indexing="ij")
        mask = np.where(j <= i, 0.0, MASK_VALUE).astype(np.float32)[None, None]
        head = np.zeros((1, 1, G - 1), np.float32)
        head[..., k - 1] = 1.0
        return {"embeds": slots[None].astype(np.float32), "cos": self.p_rope[0][None, None],
                "sin": self.p_rope[1][None, None], "mask": mask, "head": head}

    def window_frame(self, run, hidden, c0, forced=None, record=None):
        G, H = self.cfg.num_code_groups, self.cfg.talker.hidden_size
        slots = np.zeros((G, H), np.float32)
        slots[0], slots[1] = hidden, self.codec[c0]
        outs, codes = [], []
        for k in range(1, G):
            if k >= 2:
                slots[k] = self.pred_tables[k - 2][forced[k - 2] if forced is not None else codes[-1]]
            f = self.window_feed(slots, k)
            if record is not None:
                record(f)
            o = run(f)
            outs.append(o)
            codes.append(int(np.argmax(o[0].reshape(-1))))
        return outs, codes

    # -- code predictor: one call per frame ------------------------------------------------------------
    def frame_feed(self, hidden, c0, forced=None, u=None):
        """The frame graph's feed: ``forced`` (codes c1..c15) teacher-forces the gathers; ``u`` [15] uniforms sample
        (``None``: zeros, the greedy codes)."""
        G = self.cfg.num_code_groups
        i, j = np.meshgrid(np.arange(G), np.arange(G + 1), indexing="ij")   # column 0: the zero K/V slot
        return {"embeds": np.stack((hidden, self.codec[c0]))[None].astype(np.float32),
                "cos": self.p_rope[0][None, None], "sin": self.p_rope[1][None, None],
                "mask": np.where((j >= 1) & (j <= i + 1), 0.0, MASK_VALUE).astype(np.float32)[None, None],
                "u": np.zeros((1, G - 1), np.float32) if u is None else np.asarray(u, np.float32).reshape(1, G - 1),
                "forced": np.asarray(forced if forced is not None else [0] * (G - 1), np.float32).reshape(1, G - 1),
                "force": np.full((1, 1), float(forced is not None), np.float32)}

    def frame_call(self, run, hidden, c0, forced=None, record=None, u=None):
        """One graph call for one frame -> ([logits [1,15,V], codes [1,15]], the graph's own codes c1..c15)."""
        f = self.frame_feed(hidden, c0, forced, u)
        if record is not None:
            record(f)
        o = run(f)
        return [o], [int(c) for c in np.asarray(o[1]).reshape(-1)]

    # -- the fp32 pipeline ------------------------------------------------------------------------------
    def generate(self, text: str, max_prompt_tokens: int, frames: int, talker_run=None, pred_run=None,
                 frame_run=None) -> Utterance:
        """Greedy talker + code predictor (eager fp32 unless runners are given) for ``frames`` frames; stops early
        at a control id (what EOS does in the official loop). The code predictor is the one-call frame graph
        (``frame_run``), or the step graph's 16 calls a frame when ``pred_run`` is given: in eager fp32 both give the
        same codes (``tests/families/qwen3_tts/test_qwen3_tts_frame.py``)."""
        key = (text, max_prompt_tokens, frames)
        eager = talker_run is None and pred_run is None and frame_run is None
        if eager and key in self._memo:
            return self._memo[key]
        trun = talker_run or _eager(self.talker_graph, self.talker_names())
        if pred_run is not None:
            predict = lambda h, c0: self.pred_frame(pred_run, h, c0)[1]
        else:
            frun = frame_run or _eager(self.frame_graph, list(self.frame_feed(self.codec[0], 0)))
            predict = lambda h, c0: self.frame_call(frun, h, c0)[1]
        ids = self.tokenizer.encode(text, max_prompt_tokens)
        if len(PREFIX) + frames - 1 > self.context:
            raise ValueError(f"{len(PREFIX)} prefix rows + {frames} frames exceed the talker context {self.context}")
        caches, embeds, hidden, codes = self.talker_caches(), [], [], []
        rows = [self.codec[c] + self.text_row(ids, t) for t, c in enumerate(PREFIX)]
        pos = 0
        while True:
            e = rows[pos] if pos < len(rows) else rows[-1]
            embeds.append(e)
            o = trun(self.talker_feed(caches, e, pos))
            self.talker_write(caches, o, pos)
            pos += 1
            if pos < len(PREFIX):
                continue
            c0 = int(np.argmax(o[0].reshape(-1)))
            if c0 >= self.cfg.decoder.codebook_size:
                break
            h = o[1].reshape(-1)
            rest = predict(h, c0)
            hidden.append(h)
            codes.append([c0] + rest)
            if len(codes) == frames:
                break
            rows.append(self.frame_embed(codes[-1], ids, pos))
        u = Utterance(ids, np.stack(embeds), np.stack(hidden), np.asarray(codes, np.int64).reshape(-1, 16))
        if eager:
            self._memo[key] = u
        return u

    # -- Code2Wav streaming ------------------------------------------------------------------------------
    def latents(self, codes: np.ndarray) -> np.ndarray:
        """codes [frames, 16] -> [1, codebook_dim, frames]: the sum of the 16 folded codebook gathers."""
        lat = sum(self.dec_tables[j][codes[:, j]] for j in range(codes.shape[1]))
        return lat.T[None].astype(np.float32)

    def dec_state(self):
        c = self.cfg.decoder
        shape = (1, c.num_key_value_heads, c.sliding_window - 1, c.head_dim)
        st = {f"{kv}_cache_{i}": np.zeros(shape, np.float32) for i in range(c.num_hidden_layers) for kv in "kv"}
        for j, (ch, n) in enumerate(self.chunk_graphs[CHUNK].tail_specs()):
            st[f"tail_{j}"] = np.zeros((1, ch, n), np.float32)
        return st

    def chunk_feed(self, state, lat, p0):
        c = self.cfg.decoder
        n, W = lat.shape[-1], c.sliding_window - 1
        cos, sin = rope_table(c.inv_freq(), np.arange(p0, p0 + n))
        mask = np.full((1, 1, n, W + n), MASK_VALUE, np.float32)
        for i in range(n):
            first = max(i, W - p0)              # cache slot s holds position p0 - W + s; window keeps s >= i
            mask[0, 0, i, first:W] = 0.0
            mask[0, 0, i, W: W + i + 1] = 0.0
        return {"latents": lat, "cos": cos[None, None], "sin": sin[None, None], "mask": mask, **state}

    def chunk_write(self, state, outs):
        c = self.cfg.decoder
        W, nl = c.sliding_window - 1, c.num_hidden_layers
        for i in range(nl):
            for kv, o in (("k", outs[1 + 2 * i]), ("v", outs[2 + 2 * i])):
                state[f"{kv}_cache_{i}"] = np.concatenate((state[f"{kv}_cache_{i}"], o), axis=2)[:, :, -W:]
        j = 0
        while f"tail_{j}" in state:
            state[f"tail_{j}"] = outs[1 + 2 * nl + j]
            j += 1

    def stream(self, runs: dict, codes: np.ndarray, schedule, record=None, max_steps=None):
        """Decode ``codes`` [frames, 16] chunk by chunk. ``runs``: chunk size -> runner; ``schedule``: chunk sizes
        (the last chunk is padded with code 0 and its audio trimmed: the decoder is causal). Returns the audio
        [samples] and the per-chunk outputs."""
        state, p0, audio, outs = self.dec_state(), 0, [], []
        spf, F = self.cfg.decoder.samples_per_frame, codes.shape[0]
        for n in schedule:
            if p0 >= F or (max_steps is not None and len(outs) >= max_steps):
                break
            chunk = codes[p0: p0 + n]
            valid = chunk.shape[0]
            if valid < n:
                chunk = np.concatenate((chunk, np.zeros((n - valid, codes.shape[1]), np.int64)))
            f = self.chunk_feed(state, self.latents(chunk), p0)
            if record is not None:
                record(f)
            o = runs[n](f)
            self.chunk_write(state, o)
            audio.append(o[0].reshape(-1)[: valid * spf])
            outs.append(o)
            p0 += n
        return np.concatenate(audio) if audio else np.zeros(0, np.float32), outs

    def chunk_runner(self, n):
        g = self.chunk_graphs[n]
        names = list(self.chunk_feed(self.dec_state(), np.zeros((1, self.cfg.decoder.codebook_dim, n), np.float32), 0))
        return _eager(g, names)

    @torch.no_grad()
    def full_decode(self, codes: np.ndarray, dec=None) -> np.ndarray:
        return (dec or self.dec)(torch.from_numpy(codes.T[None].copy())).numpy().reshape(-1)

    def exact_decode(self, codes: np.ndarray) -> np.ndarray:
        """The full decode in fp64: exact arithmetic to judge fp32 against. At the real decoder size fp32 itself is
        only ~89 dB from it (``benchmarks/code2wav_fp32_floor.py``), so an fp32 full decode is no exact target."""
        if "dec64" not in self._memo:
            self._memo["dec64"] = copy.deepcopy(self.dec).double()
        return self.full_decode(codes, self._memo["dec64"])

    @torch.no_grad()
    def left_context_decode(self, codes: np.ndarray, schedule, context: int = 72) -> np.ndarray:
        """The approximate streaming mode: each chunk decoded from scratch with ``context`` frames of left context."""
        out, p0 = [], 0
        spf = self.cfg.decoder.samples_per_frame
        for n in schedule:
            if p0 >= codes.shape[0]:
                break
            lo = max(0, p0 - context)
            w = self.full_decode(codes[lo: p0 + n])
            out.append(w[(p0 - lo) * spf:])
            p0 += n
        return np.concatenate(out)


def schedule(frames: int, first: int = FIRST_CHUNK, chunk: int = CHUNK) -> list[int]:
    """The serving schedule covering ``frames``: [first, chunk, chunk, ...]."""
    s = [first]
    while sum(s) < frames:
        s.append(chunk)
    return s


def host_for(bundle, context: int) -> TTSHost:
    """One host per bundle and context (the fp32 runs it memoises are shared by every component)."""
    cache = bundle.__dict__.setdefault("_tts_hosts", {})
    if context not in cache:
        cache[context] = TTSHost(bundle, context)
    return cache[context]
