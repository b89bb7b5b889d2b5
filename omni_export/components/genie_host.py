"""The numpy stand-in of Genie's dialog over a Genie-form graph (``decoder_genie``): inputs filled as Genie fills them
(one linear cache, mask 0 / ``GENIE_MASK``, cos/sin of ``rope-theta`` at half width), prompts in AR-N calls, greedy
AR-1 steps. Tests, the CPU runs and the prompt processor's calibration (``GenieForm.calibration_feeds``) use it."""
from __future__ import annotations

import numpy as np

from ..blocks.layers import rope_inv_freq
from .base import Runner

GENIE_MASK = -1000.0  # what Genie writes for a slot a row must not see (measured, deploy_runtimes.md section 4)


class GenieHost:
    """Fills a Genie-form graph's inputs as Genie does (one linear cache, mask 0 / ``GENIE_MASK``, cos/sin of
    ``rope-theta`` at half width) and runs a prompt through the AR-N graph then greedy AR-1 steps: the numpy
    stand-in of Genie's dialog that tests and the CPU runs use. ``runs``: {ar: runner over that variant's inputs}."""

    def __init__(self, cfg, context: int, theta: int, mask_fill: float = GENIE_MASK, k_transposed: bool = True):
        self.cfg, self.context, self.theta = cfg, context, theta
        self.mask_fill, self.k_transposed = mask_fill, k_transposed
        self.inv = rope_inv_freq(theta, cfg.head_dim)

    def feed(self, names, ar: int, ids: list[int], p0: int, keys: list, vals: list) -> dict[str, np.ndarray]:
        """Inputs of a call over ``ids`` (at most ``ar``, right-padded with the last id) at positions p0.., with the
        rows of positions < p0 in ``keys``/``vals`` (per layer [nkv, p0, hd])."""
        C, n, hd = self.context, len(ids), self.cfg.head_dim
        P = C - ar
        f = {"input_ids": np.array([list(ids) + [ids[-1]] * (ar - n)], np.int32)}
        m = np.full((ar, C), self.mask_fill, np.float32)
        m[:n, :p0] = 0.0
        m[:n, P:P + n][np.tril(np.ones((n, n), bool))] = 0.0
        f["attention_mask"] = m[None, None]
        pos = p0 + np.minimum(np.arange(ar), n - 1)
        ang = pos[:, None].astype(np.float64) * self.inv[None, :]
        f["position_ids_cos"] = np.cos(ang).astype(np.float32)[None, None]
        f["position_ids_sin"] = np.sin(ang).astype(np.float32)[None, None]
        for i in range(self.cfg.num_hidden_layers):
            k = np.zeros((self.cfg.num_key_value_heads, 1, P, hd), np.float32)
            v = np.zeros_like(k)
            if p0:
                k[:, 0, :p0], v[:, 0, :p0] = keys[i][:, :p0], vals[i][:, :p0]
            f[f"past_key_{i}_in"] = k.transpose(0, 1, 3, 2).copy() if self.k_transposed else k
            f[f"past_value_{i}_in"] = v
        return {k: v for k, v in f.items() if k in names}

    def prompt_calls(self, names, run: Runner, ar: int, ids: list[int]):
        """Prompt ``ids`` through the AR-``ar`` graph ``run`` (inputs ``names``) as Genie sends it: calls of ``ar`` rows
        from position 0 (the attention sink included), each over the rows the calls before it wrote. Yields each
        call's feed before it runs."""
        L = self.cfg.num_hidden_layers
        keys = [np.zeros((self.cfg.num_key_value_heads, 0, self.cfg.head_dim), np.float32) for _ in range(L)]
        vals = [k.copy() for k in keys]
        for p in range(0, len(ids), ar):
            chunk = ids[p:p + ar]
            f = self.feed(names, ar, chunk, p, keys, vals)
            yield f
            self.append(run(f), len(chunk), keys, vals)

    def append(self, o: list[np.ndarray], n: int, keys: list, vals: list) -> None:
        """Append the first ``n`` new K/V rows of a call's outputs ``o`` (logits, then each layer's K, V) to
        ``keys``/``vals``."""
        for i in range(self.cfg.num_hidden_layers):
            kn = o[1 + 2 * i][:, 0, :, :n].transpose(0, 2, 1) if self.k_transposed else o[1 + 2 * i][:, 0, :n]
            keys[i] = np.concatenate([keys[i], kn], axis=1)
            vals[i] = np.concatenate([vals[i], o[2 + 2 * i][:, 0, :n]], axis=1)

    def generate(self, runs: dict[int, tuple[list[str], Runner]], ids: list[int], n_new: int):
        """Greedy ``n_new`` tokens after ``ids``: the prompt in AR-N chunks (AR-1 when only that variant is given),
        then AR-1 steps. Returns (tokens, logits [steps, V] of every generated position)."""
        L = self.cfg.num_hidden_layers
        keys = [np.zeros((self.cfg.num_key_value_heads, 0, self.cfg.head_dim), np.float32) for _ in range(L)]
        vals = [k.copy() for k in keys]
        arn = max(runs)
        out_logits, gen, seq, p = [], [], list(ids), 0

        def call(ar, chunk, p0):
            names, run = runs[ar]
            o = run(self.feed(names, ar, chunk, p0, keys, vals))
            self.append(o, len(chunk), keys, vals)
            return o[0][0, len(chunk) - 1]

        while p < len(seq):
            chunk = seq[p:p + arn]
            last = call(arn, chunk, p)
            p += len(chunk)
        while len(gen) < n_new:
            out_logits.append(last)
            gen.append(int(np.argmax(last)))
            if len(gen) == n_new or p >= self.context:
                break
            last = call(1, [gen[-1]], p)
            p += 1
        return gen, np.stack(out_logits) if out_logits else np.zeros((0, self.cfg.vocab_size), np.float32)
