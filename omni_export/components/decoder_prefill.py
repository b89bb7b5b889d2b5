"""AR-N prefill of any DecoderLM-protocol model (``decoder_lm``): ``rows`` prompt tokens per graph call, into the
same caches the AR-1 decode step uses.

The graph is the decode step's (``decode_graph.DecodeStep``: its layers take any number of rows) with N-row inputs: embeds
[1,N,H], RoPE tables [1,1,N,rot], masks [1,1,N,C+N] (full) and [1,1,N,W-1+N] (sliding: the ring of the last W-1
positions, then the chunk), the same caches; out come logits [1,N,V] and the N new K/V rows per layer. The host
splits a prompt into chunks of N (the last one padded; pad rows are masked out of every real row and never written
to a cache), then hands the caches to the decode loop. Parity is per position: each prompt position's logits and
K/V rows against the fp32 prefill, and the artifact's top-1 token against fp32's at every position.
"""
from __future__ import annotations

import math

import numpy as np

from ..blocks.layers import FULL, MASK_VALUE, SLIDING
from .base import Component, Runner, Sequence, TensorSpec
from .decoder_lm import DecodeStepComponent
from .parts import MAX_PART_BYTES
from .decoder_qdq import prefill_qdq_policy

DEFAULT_ROWS = 128


class PrefillComponent(DecodeStepComponent):
    name = "prefill"
    kind = "lm"
    weight_sharing_peer = "decode_step"  # same layers, same weights: one context binary can serve both
    qdq_policy = prefill_qdq_policy  # decoder_qdq: row 0's sink is in every call, so fp16 islands
    calibration_batch = 1  # a call already carries ``rows`` positions: the weights are read once for all of them
    trace_is_token_loop = False  # its trace feeds chunks of ``rows`` tokens (teacher-forced throughout)

    def __init__(self, bundle, context: int, rows: int = DEFAULT_ROWS, prompt_tokens: int | None = None,
                 simulator_calls: int | None = None, parts="auto", max_part_bytes: int = MAX_PART_BYTES,
                 calibration_chunks: int | None = None):
        """``simulator_calls``: at most this many prefill calls on a bounded (simulator) runtime; 0 runs none, and
        the artifact is then reported unverified (at full size one 128-row call took 1114 s on the x86 HTP
        simulator, machine loaded). ``calibration_chunks``: at most this many prompt chunks in the calibration set (below the
        recipe's ``max_samples``): each chunk carries ``rows`` positions, where a decode-step sample carries one."""
        super().__init__(bundle, context, parts, max_part_bytes)
        if simulator_calls is not None and simulator_calls < 0:
            raise ValueError(f"simulator_calls must be >= 0, got {simulator_calls}")
        if prompt_tokens is not None and prompt_tokens < 1:
            raise ValueError(f"prompt_tokens must be >= 1, got {prompt_tokens}")
        if calibration_chunks is not None and calibration_chunks < 1:
            raise ValueError(f"calibration_chunks must be >= 1, got {calibration_chunks}")
        self.simulator_calls = simulator_calls
        self.max_calibration_samples = calibration_chunks
        if SLIDING in self.types and not 2 <= rows <= min(self.cfg.sliding_window - 1, context):
            raise ValueError(f"prefill rows {rows} must be between 2 and min(sliding_window - 1, context) = "
                             f"{min(self.cfg.sliding_window - 1, context)}")
        if not 2 <= rows <= context:
            raise ValueError(f"prefill rows {rows} must be between 2 and the context {context}")
        self.rows = rows
        # prompts are encoded up to this many tokens: a full chunk and a partial one by default
        self.prompt_tokens = min(context, prompt_tokens or rows + rows // 2)
        self.tables = self.rope_tables(np.arange(context + rows))  # pad rows of the last chunk may sit past the context

    def spec(self, name: str) -> TensorSpec:
        c, R = self.cfg, self.rows
        kind, _, tail = name.rpartition("_")
        if name == "embeds" or name.startswith("hidden_"):
            return TensorSpec(name, (1, R, c.hidden_size))
        if name == "logits":
            return TensorSpec(name, (1, R, c.vocab_size))
        if kind in ("cos", "sin"):
            return TensorSpec(name, (1, 1, R, c.rotary_dim(FULL if tail == "full" else SLIDING)))
        if name == "mask_full":
            return TensorSpec(name, (1, 1, R, self.context + R))
        if name == "mask_sliding":
            return TensorSpec(name, (1, 1, R, c.sliding_window - 1 + R))
        if kind in ("k_new", "v_new"):
            return TensorSpec(name, (1, c.num_key_value_heads, R, c.head_dim))
        return super().spec(name)

    def describe(self) -> dict:
        return {**super().describe(), "rows": self.rows, "prompt_tokens": self.prompt_tokens,
                "simulator_calls": self.simulator_calls, "calibration_chunks": self.max_calibration_samples,
                "host": "prompt split into chunks of `rows` (last padded), embedding gather, RoPE tables and masks "
                        "in fp32; new K/V rows of real positions written into the decode step's caches"}

    # -- host loop -----------------------------------------------------------------------------------
    def feed_chunk(self, caches: dict, tokens: list[int], p0: int) -> dict[str, np.ndarray]:
        R, C, W = self.rows, self.context, self.cfg.sliding_window
        n = len(tokens)
        if not 1 <= n <= R or p0 < 0 or p0 + n > C:
            raise ValueError(f"chunk of {n} tokens at position {p0} does not fit {R} rows / context {C}")
        f = {"embeds": self.embedding[list(tokens) + [0] * (R - n)][None]}
        for tag, (cos, sin) in self.tables.items():
            f[f"cos_{tag}"] = cos[p0:p0 + R][None, None]
            f[f"sin_{tag}"] = sin[p0:p0 + R][None, None]
        i, j = np.arange(R)[:, None], np.arange(R)[None, :]
        causal = j <= i  # within the chunk (R <= W - 1, so the window never cuts inside it)
        if FULL in self.types:
            mf = np.full((R, C + R), MASK_VALUE, np.float32)
            mf[:, :p0] = 0.0
            mf[:, C:][causal] = 0.0
            f["mask_full"] = mf[None, None]
        if SLIDING in self.types:
            ring = W - 1
            q = p0 - 1 - ((p0 - 1 - np.arange(ring)) % ring)  # the latest position < p0 each ring slot holds (< 0: empty)
            seen = (q[None, :] >= 0) & (q[None, :] >= p0 + i - (W - 1))
            ms = np.full((R, ring + R), MASK_VALUE, np.float32)
            ms[:, :ring][seen] = 0.0
            ms[:, ring:][causal] = 0.0
            f["mask_sliding"] = ms[None, None]
        f.update(caches)
        return f

    def write_chunk(self, caches: dict, outputs: list[np.ndarray], p0: int, n: int) -> None:
        ring = self.cfg.sliding_window - 1
        for i, lt in enumerate(self.cfg.layer_types):
            slots = np.arange(p0, p0 + n) if lt == FULL else np.arange(p0, p0 + n) % ring
            caches[f"k_cache_{i}"][:, :, slots] = outputs[1 + 2 * i][:, :, :n]
            caches[f"v_cache_{i}"][:, :, slots] = outputs[2 + 2 * i][:, :, :n]

    def per_position(self, outputs: list[np.ndarray], n: int) -> list[np.ndarray]:
        """A call's outputs as ``n`` decode-step-shaped rows: logits/hidden [n,1,X], K/V [n,nkv,1,hd] (views of the
        outputs, not copies)."""
        out = []
        for s, o in zip(self.output_specs(), outputs):
            if s.name.startswith(("k_new", "v_new")):
                out.append(o[0, :, :n].transpose(1, 0, 2)[:, :, None, :])
            else:
                out.append(o[0, :n][:, None, :])
        return out

    def chunks(self, run: Runner, tokens: list[int], max_calls: int | None = None):
        """Prefill ``tokens`` chunk by chunk; yields ``(feed, outputs, n)`` before the chunk's rows are written."""
        caches = self.new_caches()
        for c, p0 in enumerate(range(0, len(tokens), self.rows)):
            if max_calls is not None and c >= max_calls:
                return
            chunk = tokens[p0:p0 + self.rows]
            f = self.feed_chunk(caches, chunk, p0)
            o = run(f)
            yield f, o, len(chunk)
            self.write_chunk(caches, o, p0, len(chunk))

    def prefill(self, run: Runner, tokens: list[int], max_calls: int | None = None) -> dict[str, np.ndarray]:
        """Per-position outputs (stacked like the decode loop's) over the prefilled tokens: each call's rows are
        copied into arrays of every prefilled position as the call returns, so no per-call copies are held beside
        them (Gemma 3's 605 positions of logits are 634 MB)."""
        names, out, done = [s.name for s in self.output_specs()], {}, 0
        total = len(tokens) if max_calls is None else min(len(tokens), max_calls * self.rows)
        for _, o, n in self.chunks(run, tokens, max_calls):
            for nm, rows in zip(names, self.per_position(o, n)):
                if nm not in out:
                    out[nm] = np.empty((total, *rows.shape[1:]), rows.dtype)
                out[nm][done: done + n] = rows
            done += n
        return {nm: a[:done] for nm, a in out.items()}

    def encode_prompts(self, prompts) -> list[list[int]]:
        return [self.encode(p, self.prompt_tokens) for p in prompts.prompts]

    def reference(self, prompts, opts) -> list[Sequence]:
        """fp32 prefill of each parity prompt (up to ``prompt_tokens``). The tokens fp32 predicts at every position
        are the targets the artifact's top-1 is checked against (``n_prompt`` = 1: every position is scored)."""
        out = []
        for ids in self.encode_prompts(prompts):
            outs = self.prefill(self.eager_runner(), ids)
            out.append(Sequence(ids, 1, outs, [int(t) for t in outs["logits"].reshape(len(ids), -1).argmax(-1)]))
        return out

    def trace(self, run: Runner, reference: list[Sequence], max_steps: int | None,
              forced_only: bool = False) -> list[Sequence]:
        """Every call is teacher-forced (``forced_only`` changes nothing)."""
        if max_steps is not None and self.simulator_calls is not None:  # a bounded runtime
            max_steps = min(max_steps, self.simulator_calls)
        out, budget = [], max_steps
        for ref in reference:
            calls = math.ceil(len(ref.tokens) / self.rows)
            if budget is not None and budget <= 0:
                break
            outs = self.prefill(run, ref.tokens, budget)
            budget = None if budget is None else budget - calls
            n = len(next(iter(outs.values())))
            out.append(Sequence(ref.tokens[:n], 1, outs))
        return out

    def calibration_feeds(self, prompts, opts):
        """Every chunk the fp32 prefill feeds over the calibration prompts."""
        for ids in self.encode_prompts(prompts):
            for f, _, _ in self.chunks(self.eager_runner(), ids):
                yield {k: v.copy() for k, v in f.items()}

    def indexed_calibration_feeds(self, prompts, opts, keep: set[int], pools: dict | None = None):
        """``(index, feed)`` of the kept chunks, in ``calibration_feeds``' order and with the same feeds: a chunk runs
        through the eager fp32 prefill only when a later kept chunk of its prompt reads the K/V rows it writes, so
        a prompt's chunks after its last kept one, and that one, are never run (full size: 3 of 18 chunk forwards
        for 6 kept chunks, instead of 18)."""
        i, run = 0, self.eager_runner()
        for ids in self.encode_prompts(prompts):
            starts = list(range(0, len(ids), self.rows))
            last = max((c for c in range(len(starts)) if i + c in keep), default=-1)
            caches = self.new_caches() if last >= 0 else None
            for c, p0 in enumerate(starts[:last + 1]):
                chunk = ids[p0:p0 + self.rows]
                f = self.feed_chunk(caches, chunk, p0)
                if i + c in keep:
                    yield i + c, {k: v.copy() for k, v in f.items()}
                if c < last:
                    self.write_chunk(caches, run(f), p0, len(chunk))
            i += len(starts)

    def calibration_note(self, prompts, opts) -> None:
        return None  # the prefill is calibrated on every row, sinks included (docs/parity.md)

    reference_note = Component.reference_note  # every row is the prefill's own, position 0 included
    parity_first_step = 0  # and every row is compared

    def calibration_steps(self, prompts, opts) -> int:
        return sum(math.ceil(len(ids) / self.rows) for ids in self.encode_prompts(prompts))
