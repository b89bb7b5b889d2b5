"""Qwen3-TTS code predictor, one graph call per frame (``graphs.PredictorFrame``): the 15 passes unrolled, the frame's
K/V inside the graph, each pass's code sampled in the graph from a host uniform and gathered as the next pass's input.

Parity keeps the step graph's layout (``predictor.py``), so the same token figures judge both: one sequence per
frame, 16 positions (talker hidden, C(c0), then tables of c1..c14), logits row 0 all zeros as the step graph's (the
talker-hidden position predicts nothing and is not scored), rows 1..15 the graph's 15 heads. Teacher-forced over the
fp32 codes (``force`` 1, ``u`` 0), then free-running (``force`` 0, ``u`` 0: greedy) for the greedy agreement."""
from __future__ import annotations

from typing import Iterator

import numpy as np

from ...components.base import Runner, Sequence, TensorSpec
from .predictor import _PredictorBase

CALIBRATION_SEED = 0


class PredictorFrameComponent(_PredictorBase):
    """One call per frame: inputs the talker hidden and C(c0) rows, RoPE tables, the causal mask, 15 uniforms and the
    forced codes with their 0/1 switch; outputs the 15 heads' logits and the 15 codes."""
    name = "code_predictor_frame"
    graph_calls = 1

    def __init__(self, bundle, context: int, simulator_frames: int | None = None):
        """``simulator_frames``: at most this many frame calls on a bounded (simulator) runtime, which caps the
        recipe's ``simulator_steps`` for this component (a frame call is 15 passes of work)."""
        if simulator_frames is not None and simulator_frames < 1:
            raise ValueError(f"simulator_frames must be >= 1, got {simulator_frames}")
        super().__init__(bundle, context)
        self.simulator_frames = simulator_frames
        self.module = self.host.frame_graph

    def input_specs(self) -> list[TensorSpec]:
        p, G, H = self.cfg.predictor, self.cfg.num_code_groups, self.cfg.talker.hidden_size
        return [TensorSpec("embeds", (1, 2, H)), TensorSpec("cos", (1, 1, G, p.head_dim)),
                TensorSpec("sin", (1, 1, G, p.head_dim)), TensorSpec("mask", (1, 1, G, G + 1)),
                TensorSpec("u", (1, G - 1)), TensorSpec("forced", (1, G - 1)), TensorSpec("force", (1, 1))]

    def output_specs(self) -> list[TensorSpec]:
        G = self.cfg.num_code_groups
        return [TensorSpec("logits", (1, G - 1, self.cfg.predictor.vocab_size)), TensorSpec("codes", (1, G - 1))]

    def describe(self) -> dict:
        return super().describe() | {
            "simulator_frames": self.simulator_frames,
            "host": "C(c0) gather, RoPE tables and the causal mask in fp32; uniforms for in-graph top-k sampling "
                    "(0: greedy); forced codes and a 0/1 switch for teacher forcing"}

    def frame(self, run, hidden, c0, forced=None, record=None, u=None):
        return self.host.frame_call(run, hidden, c0, forced, record, u)

    def _sequence(self, outs, tokens, generated=()) -> Sequence:
        logits, codes = outs[0]
        rows = np.concatenate((np.zeros_like(logits[:, :1]), logits), axis=1)      # [1,16,V]: the step layout
        return Sequence(tokens, 2, {"logits": rows.reshape(rows.shape[1], 1, -1), "codes": codes}, list(generated))

    def reference(self, prompts, opts) -> list[Sequence]:
        out = []
        for h, codes in self._frames(prompts, opts):
            outs, got = self.frame(self.eager_runner(), h, codes[0], forced=codes[1:])
            assert got == codes[1:], "eager replay must reproduce the pipeline's codes"
            seq = self._sequence(outs, [-1] + codes[:15], codes[1:])
            seq.outputs["in.hidden"] = h[None]
            out.append(seq)
        return out

    def calibration_feeds(self, prompts, opts) -> Iterator[dict[str, np.ndarray]]:
        """Teacher-forced frames with uniforms over [0, 1): the sampler's comparisons see the range they run at."""
        rng = np.random.default_rng(CALIBRATION_SEED)
        for h, codes in self._frames(prompts, opts):
            yield self.host.frame_feed(h, codes[0], codes[1:], rng.random(self.cfg.num_code_groups - 1))

    def trace(self, run: Runner, reference: list[Sequence], max_steps: int | None) -> list[Sequence]:
        if max_steps is not None and self.simulator_frames is not None:
            max_steps = min(max_steps, self.simulator_frames)
        tf = reference if max_steps is None else reference[:max_steps]
        out = []
        for ref in tf:   # teacher-forced first (it is gated)
            outs, _ = self.frame(run, ref.outputs["in.hidden"][0], ref.tokens[1], forced=ref.generated)
            out.append(self._sequence(outs, ref.tokens))
        free = len(out) if max_steps is None else max(0, max_steps - len(out))
        for ref, seq in list(zip(reference, out))[:free]:
            _, seq.generated = self.frame(run, ref.outputs["in.hidden"][0], ref.tokens[1])
        return out
