"""HiFT streaming on the host: fixed-shape window graphs whose centres equal the full decode exactly.

The original HiFT is not causal: an output sample depends on mel and source frames up to 14 frames either side
(measured with the tiny preset: ``tests/families/minicpmo/test_minicpmo_hift.py``), and the F0 predictor on 5
either side. So the stream decodes windows of ``CONTEXT`` + ``chunk`` + ``CONTEXT`` frames and keeps the middle
``chunk`` (the carried state is the last ``2 * CONTEXT`` mel frames and source samples), and computes F0 in
windows of ``chunk`` + 2 x ``F0_CONTEXT``. The full decode it equals is HiFT over the utterance with ``CONTEXT``
zero frames either side (and F0 over that with ``F0_CONTEXT`` more), right-padded to whole chunks: the zero frames
are the one definitional choice, so every window is interior and exact. The NSF source is computed on the host in
fp64 from the f0 so far (``hift.nsf_harmonics``) with a seeded noise table indexed by absolute sample.
"""
from __future__ import annotations

import copy

import numpy as np
import torch

from .hift import nsf_harmonics

CONTEXT = 25      # >= the 14-frame receptive field either side; 2 x 25 = one 50-frame chunk of padding in all
F0_CONTEXT = 8    # >= the F0 predictor's 5 frames either side


class HiFTHost:
    def __init__(self, hift, cfg, chunk: int = 50, seed: int = 0, max_frames: int = 3000):
        self.hift, self.c, self.N = hift, cfg.hift, chunk
        spf = self.c.samples_per_frame
        rng = np.random.default_rng(seed)
        self.noise = rng.standard_normal((self.c.nb_harmonics + 1, max_frames * spf))
        self.W, self.Wf = 2 * CONTEXT + chunk, 2 * F0_CONTEXT + chunk

    def h64(self):
        if not hasattr(self, "_h64"):
            self._h64 = copy.deepcopy(self.hift).double()
        return self._h64

    def ext(self, mel: np.ndarray) -> np.ndarray:
        """[80, T] -> [80, E]: CONTEXT zero frames, the mel right-padded to whole chunks, CONTEXT zero frames."""
        T = mel.shape[1]
        K = -(-T // self.N)
        return np.pad(mel, ((0, 0), (CONTEXT, K * self.N - T + CONTEXT))).astype(np.float32)

    def full_decode(self, mel: np.ndarray) -> np.ndarray:
        """The exact reference in fp64: F0, NSF and HiFT over the whole padded utterance -> [T * spf]."""
        h, spf, T = self.h64(), self.c.samples_per_frame, mel.shape[1]
        e = torch.from_numpy(self.ext(mel)).double()[None]
        with torch.no_grad():
            f0 = h.f0_predictor(torch.nn.functional.pad(e, (F0_CONTEXT, F0_CONTEXT)))[0, F0_CONTEXT:-F0_CONTEXT]
            har = torch.from_numpy(nsf_harmonics(f0.numpy(), self.c, self.noise))[None]
            audio = h.decode(e, har)[0].numpy()
        return audio[CONTEXT * spf: (CONTEXT + T) * spf]

    def f0_host(self, feed):
        """F0 on the host in fp64 (the default): upstream's causal vocoder does the same, and an fp32 F0 graph
        costs the audio ~50 dB (68 dB against 117 over 130 frames, tiny preset) through the cumulative phase."""
        with torch.no_grad():
            return [self.h64().f0_predictor(torch.from_numpy(feed["mel"]).double()).numpy()]

    def stream(self, runs: dict, mel: np.ndarray, record=None):
        """``runs``: {"hift": runner of ``HiFTDecode`` on W frames, optionally "f0": runner of ``F0Graph`` on Wf
        frames (else ``f0_host``)}. Returns the audio [T * spf] and, per HiFT chunk, how many mel frames it had
        read (the stream's look-ahead)."""
        runs = {"f0": self.f0_host, **runs}
        N, spf, T = self.N, self.c.samples_per_frame, mel.shape[1]
        e = self.ext(mel)
        E = e.shape[1]
        ef = np.pad(e, ((0, 0), (F0_CONTEXT, F0_CONTEXT)))
        f0, out, reads = [], [], []
        for k in range(E // N - 1):
            need = min(k * N + self.W + 1, E)           # f0 through the window's end (+1: the source interpolates)
            while len(f0) * N < need:
                j = len(f0)
                feed = {"mel": ef[None, :, j * N: j * N + self.Wf]}
                if record is not None:
                    record("f0", feed)
                f0.append(runs["f0"](feed)[0][0, F0_CONTEXT: F0_CONTEXT + N])
            har = nsf_harmonics(np.concatenate(f0), self.c, self.noise)
            feed = {"mel": e[None, :, k * N: k * N + self.W],
                    "harmonics": har[None, :, k * N * spf: (k * N + self.W) * spf].astype(np.float32)}
            if record is not None:
                record("hift", feed)
            a = runs["hift"](feed)[0][0]
            out.append(a[CONTEXT * spf: (CONTEXT + N) * spf])
            reads.append(len(f0) * N + 2 * F0_CONTEXT - CONTEXT)   # mel frames (of the utterance) read so far
        return np.concatenate(out)[: T * spf], reads
