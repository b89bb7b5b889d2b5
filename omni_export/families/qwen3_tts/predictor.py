"""Qwen3-TTS code predictor for one frame: the KV-cached step graph and the 16-slot window graph.

One parity sequence per frame: the talker hidden state and codebook-0 code come from the fp32 pipeline; the 15
codes c1..c15 are the greedy targets. Teacher-forced over the reference codes, then free-running (the artifact's
own codes fed back) for the greedy agreement."""
from __future__ import annotations

from typing import Iterator

import numpy as np
import torch

from ...components.base import Component, Graph, Runner, Sequence, TensorSpec
from .forms import target_form
from .graphs import PredictorStep
from .host import host_for


class _PredictorBase(Component):
    kind = "lm"
    graph_calls = 16

    def __init__(self, bundle, context: int):
        self.cfg = bundle.config
        self.host = host_for(bundle, context)   # the talker context: the fp32 pipeline produces the frames

    def frame(self, run, hidden, c0, forced=None, record=None):
        raise NotImplementedError

    def describe(self) -> dict:
        return {"name": self.name, "inputs": [[s.name, list(s.shape)] for s in self.input_specs()],
                "outputs": [[s.name, list(s.shape)] for s in self.output_specs()],
                "host": "codec table gathers, RoPE tables and masks in fp32, one-hot head selector"}

    def graph_for(self, target: str, graph: Graph, scheme):
        return target_form(target, graph.module)

    def _stack(self, outs):
        names = [s.name for s in self.output_specs()]
        return {n: np.concatenate([o[i] for o in outs]) for i, n in enumerate(names)}

    def _frames(self, prompts, opts):
        for p in prompts.prompts:
            u = self.host.generate(p, opts["max_prompt_tokens"], opts["new_tokens"])
            for h, codes in zip(u.hidden, u.codes):
                yield h, [int(c) for c in codes]

    def reference(self, prompts, opts) -> list[Sequence]:
        out = []
        for h, codes in self._frames(prompts, opts):
            outs, got = self.frame(self.eager_runner(), h, codes[0], forced=codes[1:])
            assert got == codes[1:], "eager replay must reproduce the pipeline's codes"
            seq = self._stack(outs)
            seq["in.hidden"] = h[None]
            n_prompt = self.graph_calls - 14   # logits of call n_prompt-1+j predict c_{j+1}
            out.append(Sequence(([-1] if n_prompt == 2 else []) + codes[:15], n_prompt, seq, codes[1:]))
        return out

    def calibration_steps(self, prompts, opts) -> int:
        return sum(self.graph_calls for _ in self._frames(prompts, opts))

    def calibration_feeds(self, prompts, opts) -> Iterator[dict[str, np.ndarray]]:
        for h, codes in self._frames(prompts, opts):
            feeds = []
            self.frame(self.eager_runner(), h, codes[0], forced=codes[1:],
                       record=lambda f: feeds.append({k: v.copy() for k, v in f.items()}))
            yield from feeds

    def trace(self, run: Runner, reference: list[Sequence], max_steps: int | None) -> list[Sequence]:
        budget, out = max_steps, []
        c0_at = self.graph_calls - 15   # index of c0 in the fed tokens
        for ref in reference:   # teacher-forced first (it is gated), whole frames only
            if budget is not None and budget < self.graph_calls:
                break
            outs, _ = self.frame(run, ref.outputs["in.hidden"][0], ref.tokens[c0_at], forced=ref.generated)
            out.append(Sequence(ref.tokens, ref.n_prompt, self._stack(outs)))
            budget = None if budget is None else budget - self.graph_calls
        for ref, seq in zip(reference, out):
            if budget is not None and budget < self.graph_calls:
                break
            _, seq.generated = self.frame(run, ref.outputs["in.hidden"][0], ref.tokens[c0_at])
            budget = None if budget is None else budget - self.graph_calls
        return out


class PredictorStepComponent(_PredictorBase):
    """KV-cached: 16 calls per frame (talker hidden, C(c0), then table k-2 of c_{k-1}); cache of 15 rows."""
    name = "code_predictor_step"
    graph_calls = 16

    def __init__(self, bundle, context: int, sampler: bool = False):
        super().__init__(bundle, context)
        self.sampler = sampler
        self.module = PredictorStep(bundle.module.talker.code_predictor, sampler=sampler).eval() if sampler \
            else self.host.pred_graph

    def input_specs(self) -> list[TensorSpec]:
        p, G, H = self.cfg.predictor, self.cfg.num_code_groups, self.cfg.talker.hidden_size
        kv = (1, p.num_key_value_heads, G - 1, p.head_dim)
        specs = [TensorSpec("embeds", (1, 1, H)), TensorSpec("cos", (1, 1, 1, p.head_dim)),
                 TensorSpec("sin", (1, 1, 1, p.head_dim)), TensorSpec("mask", (1, 1, 1, G)),
                 TensorSpec("head", (1, 1, G - 1))]
        specs += [TensorSpec(f"{k}_cache_{i}", kv) for i in range(p.num_hidden_layers) for k in "kv"]
        return specs + ([TensorSpec("u", (1, 1, 1))] if self.sampler else [])

    def output_specs(self) -> list[TensorSpec]:
        p = self.cfg.predictor
        row = (1, p.num_key_value_heads, 1, p.head_dim)
        return [TensorSpec("logits", (1, 1, p.vocab_size))] + ([TensorSpec("token", (1, 1, 1))] if self.sampler else []) + \
               [TensorSpec(f"{k}_new_{i}", row) for i in range(p.num_hidden_layers) for k in "kv"]

    def frame(self, run, hidden, c0, forced=None, record=None):
        if self.sampler:
            raise ValueError("parity runs are greedy: build the component without the sampler")
        return self.host.pred_frame(run, hidden, c0, forced, record)


class PredictorWindowComponent(_PredictorBase):
    """Cache-free: one 16-slot window per pass (15 calls per frame), causal mask, one-hot head selector."""
    name = "code_predictor_window"
    graph_calls = 15

    def __init__(self, bundle, context: int):
        super().__init__(bundle, context)
        self.module = WindowSelect(self.host.window_graph).eval()

    def input_specs(self) -> list[TensorSpec]:
        p, G, H = self.cfg.predictor, self.cfg.num_code_groups, self.cfg.talker.hidden_size
        return [TensorSpec("embeds", (1, G, H)), TensorSpec("cos", (1, 1, G, p.head_dim)),
                TensorSpec("sin", (1, 1, G, p.head_dim)), TensorSpec("mask", (1, 1, G, G)),
                TensorSpec("head", (1, 1, G - 1))]

    def output_specs(self) -> list[TensorSpec]:
        return [TensorSpec("logits", (1, 1, self.cfg.predictor.vocab_size))]

    def frame(self, run, hidden, c0, forced=None, record=None):
        return self.host.window_frame(run, hidden, c0, forced, record)


class WindowSelect(torch.nn.Module):
    """The window graph with the pass's head row selected by the one-hot ``head`` input: logits [1,1,V]."""

    def __init__(self, window):
        super().__init__()
        self.window = window

    def forward(self, embeds, cos, sin, mask, head):
        (all_rows,) = self.window(embeds, cos, sin, mask)     # [1,G-1,V]
        return (torch.matmul(head, all_rows),)
