"""Qwen3-TTS talker decode step: IO spec and host driver (see ``host.py`` for the loop).

Parity is teacher-forced over the input rows the fp32 pipeline fed (each row sums the codec embeddings of all 16
codebooks and a projected text row, so it depends on the code predictor: the rows are part of the reference)."""
from __future__ import annotations

from typing import Iterator

import numpy as np

from ...components.base import Component, Graph, Runner, Sequence, TensorSpec
from .forms import target_form
from .host import PREFIX, host_for


class TalkerStepComponent(Component):
    name = "talker_step"
    kind = "lm"

    def __init__(self, bundle, context: int):
        t = bundle.config.talker
        if context < len(PREFIX) + 1 or context > t.max_position_embeddings:
            raise ValueError(f"context {context} outside {len(PREFIX) + 1}..{t.max_position_embeddings}")
        self.cfg, self.context = bundle.config, context
        self.host = host_for(bundle, context)
        self.module = self.host.talker_graph

    def input_specs(self) -> list[TensorSpec]:
        t = self.cfg.talker
        kv = (1, t.num_key_value_heads, self.context, t.head_dim)
        return [TensorSpec("embeds", (1, 1, t.hidden_size)), TensorSpec("cos", (1, 1, 1, t.head_dim)),
                TensorSpec("sin", (1, 1, 1, t.head_dim)), TensorSpec("mask", (1, 1, 1, self.context + 1))] + \
               [TensorSpec(f"{k}_cache_{i}", kv) for i in range(t.num_hidden_layers) for k in "kv"]

    def output_specs(self) -> list[TensorSpec]:
        t = self.cfg.talker
        row = (1, t.num_key_value_heads, 1, t.head_dim)
        return [TensorSpec("logits", (1, 1, t.vocab_size)), TensorSpec("hidden", (1, 1, t.hidden_size))] + \
               [TensorSpec(f"{k}_new_{i}", row) for i in range(t.num_hidden_layers) for k in "kv"]

    def describe(self) -> dict:
        return {"name": self.name, "context": self.context,
                "inputs": [[s.name, list(s.shape)] for s in self.input_specs()],
                "outputs": [[s.name, list(s.shape)] for s in self.output_specs()],
                "host": "text embedding + text projection, codec/predictor table gathers, RoPE tables and masks in "
                        "fp32; new K/V rows written into the caches"}

    def graph_for(self, target: str, graph: Graph, scheme):
        return target_form(target, graph.module)

    def replay(self, run: Runner, embeds: np.ndarray, record=None, max_steps=None) -> dict[str, np.ndarray]:
        caches, outs = self.host.talker_caches(), []
        for pos, e in enumerate(embeds):
            if max_steps is not None and pos >= max_steps:
                break
            f = self.host.talker_feed(caches, e, pos)
            if record is not None:
                record(f)
            o = run(f)
            self.host.talker_write(caches, o, pos)
            outs.append(o)
        names = [s.name for s in self.output_specs()]
        return {n: np.concatenate([o[i] for o in outs]) for i, n in enumerate(names)} if outs else {}

    def _utterances(self, prompts, opts):
        return [self.host.generate(p, opts["max_prompt_tokens"], opts["new_tokens"]) for p in prompts.prompts]

    def reference(self, prompts, opts) -> list[Sequence]:
        out = []
        for u in self._utterances(prompts, opts):
            outs = self.replay(self.eager_runner(), u.talker_embeds)
            outs["in.embeds"] = u.talker_embeds
            c0 = [int(c) for c in u.codes[:, 0]]
            out.append(Sequence(list(PREFIX) + c0[:-1], len(PREFIX), outs, c0))
        return out

    def calibration_steps(self, prompts, opts) -> int:
        return sum(len(u.talker_embeds) for u in self._utterances(prompts, opts))

    def calibration_feeds(self, prompts, opts) -> Iterator[dict[str, np.ndarray]]:
        for u in self._utterances(prompts, opts):
            feeds = []
            self.replay(self.eager_runner(), u.talker_embeds, record=lambda f: feeds.append({k: v.copy() for k, v in f.items()}))
            yield from feeds

    def trace(self, run: Runner, reference: list[Sequence], max_steps: int | None) -> list[Sequence]:
        budget, out = max_steps, []
        for ref in reference:
            if budget is not None and budget <= 0:
                break
            outs = self.replay(run, ref.outputs["in.embeds"], max_steps=budget)
            steps = len(outs["logits"])
            budget = None if budget is None else budget - steps
            out.append(Sequence(ref.tokens[:steps], ref.n_prompt, outs))
        return out
