"""The AR-1 decode step of any decoder LM that follows the DecoderLM protocol: graph, IO spec and the one host loop
every runtime is driven by (``decoder_prefill`` adds the AR-N prefill into the same caches).

The protocol (what a model hands these components): ``lm.config`` with num_hidden_layers, hidden_size,
num_key_value_heads, head_dim, vocab_size, max_position_embeddings, sliding_window, ``layer_types`` (each
``layers.FULL`` or ``layers.SLIDING``), ``rotary_dim(layer_type)`` and ``inv_freq(layer_type)`` (fp64 RoPE inverse
frequencies, rope scaling included); ``lm.model.layers`` whose layers have ``.layer_type`` and take
``(x, cos, sin, mask, k_cache, v_cache) -> (x, k_new, v_new)`` (``layers.DecoderLayer``); ``lm.model.norm``,
``lm.lm_head`` and ``lm.input_embedding()``. The tokenizer is the bundle's (``ModelBundle.tokenizer``).

The host gathers the token's embedding, prepares RoPE tables and additive masks in fp32, keeps the caches
(full layers: ``context`` rows; sliding layers: a ring of ``sliding_window - 1`` rows) and writes the new K/V
rows the graph returns. A sliding layer attends to its current token and the ``sliding_window - 1`` before it.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
import torch
import torch.nn as nn

from ..blocks.graph_forms import rms_norm_as_matmul
from ..blocks.layers import FULL, MASK_VALUE, SLIDING, causal_mask, rope_table
from .base import Component, Graph, Runner, Sequence, TensorSpec
from .decode_graph import HEAD_ROWS, TAGS, DecodeStep, HeadOnRows
from .lm_capture import CaptureRecord
from .lm_free_run import free_run
from .lm_sinks import SinkPlan, sink_plan
from .decoder_qdq import step_qdq_policy
from .decoder_runner import RuntimeFormsOf
from .parts import MAX_PART_BYTES, plan_parts

@torch.no_grad()
def reference_logits(lm, tokens: list[int]) -> np.ndarray:
    """Recompute-everything reference: full causal (and sliding) attention over the whole sequence, no cache.

    Returns logits [S, V]. Used to check the cached loop's fidelity."""
    cfg = lm.config
    x = lm.input_embedding()(torch.tensor(tokens)[None])
    pos = np.arange(len(tokens))
    empty = torch.zeros(1, cfg.num_key_value_heads, 0, cfg.head_dim)
    for layer in lm.model.layers:
        lt = layer.layer_type
        cos, sin = (torch.from_numpy(a)[None, None] for a in rope_table(cfg.inv_freq(lt), pos))
        x, _, _ = layer(x, cos, sin, causal_mask(len(tokens), None if lt == FULL else cfg.sliding_window), empty, empty)
    return lm.lm_head(lm.model.norm(x))[0].numpy()


SINK_NOTE = ("decode-step parity starts at position 1: position 0's K/V rows (and its logits) are the fp32 "
             "reference's, as the prefill writes them in deployment; the attention sink never enters the decode step")


class DecodeStepComponent(RuntimeFormsOf, Component):
    parity_first_step = 1  # position 0 is the reference's (``SINK_NOTE``): no graph call, not compared
    name = "decode_step"
    kind = "lm"
    qdq_policy = step_qdq_policy  # decoder_qdq: the w8a16 trained weights need
    reference_note = f"{Component.reference_note}; {SINK_NOTE}"
    supports_forced_only = trace_is_token_loop = True  # ``trace``: ``run_tokens`` per reference, then free runs
    calibration_batch = 16  # the step reads every weight for one row: 16 samples a call (``quantize.calib_batch``)

    def __init__(self, bundle, context: int, parts="auto", max_part_bytes: int = MAX_PART_BYTES, parity_from: int = 1):
        """``parity_from``: the first position parity executes; the rows before it are fp32's, as a prefill writes
        a prompt's rows in deployment (1: the sink only, ``SINK_NOTE``). Past a sliding window (e.g. 528 with a
        prompt longer than that), a bounded simulator budget is spent where the ring has wrapped."""
        cfg = bundle.config
        if context < 2 or context > cfg.max_position_embeddings:
            raise ValueError(f"context {context} outside 2..{cfg.max_position_embeddings}")
        if type(parity_from) is not int or not 1 <= parity_from < context:
            raise ValueError(f"parity_from must be an integer from 1 to context - 1 ({context - 1}), got {parity_from!r}")
        if parity_from != 1:  # else the class's own (a prefill compares from row 0)
            self.parity_first_step = parity_from
        self.bundle, self.cfg, self.context = bundle, cfg, context
        self.module = DecodeStep(bundle.module, context).eval()
        self.parts = plan_parts(bundle.module, parts, max_part_bytes)
        self.embedding = bundle.module.input_embedding().weight.detach().numpy()
        self.tokenizer = bundle.tokenizer
        self.types = [lt for lt in TAGS if lt in cfg.layer_types]  # the layer types present, in TAGS order
        self.tables = self.rope_tables(np.arange(context))

    def genie(self):
        """This decode step in the IO form Qualcomm's Genie runtime drives (``decoder_genie.GenieForm``)."""
        from .decoder_genie import GenieForm
        return GenieForm(self)

    def rope_tables(self, positions) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        return {TAGS[lt]: rope_table(self.cfg.inv_freq(lt), positions) for lt in self.types}

    # -- IO spec -----------------------------------------------------------------------------------
    def cache_len(self, layer_type: str) -> int:
        return self.module.cache_len(layer_type)

    def spec(self, name: str) -> TensorSpec:
        c = self.cfg
        kind, _, tail = name.rpartition("_")
        if name == "embeds" or name.startswith("hidden_"):
            return TensorSpec(name, (1, 1, c.hidden_size))
        if name == "logits":
            return TensorSpec(name, (1, 1, c.vocab_size))
        if kind in ("cos", "sin"):
            return TensorSpec(name, (1, 1, 1, c.rotary_dim(FULL if tail == "full" else SLIDING)))
        if name == "mask_full":
            return TensorSpec(name, (1, 1, 1, self.context + 1))
        if name == "mask_sliding":
            return TensorSpec(name, (1, 1, 1, c.sliding_window))
        if kind in ("k_cache", "v_cache"):
            return TensorSpec(name, (1, c.num_key_value_heads, self.cache_len(c.layer_types[int(tail)]), c.head_dim))
        if kind in ("k_new", "v_new"):
            return TensorSpec(name, (1, c.num_key_value_heads, 1, c.head_dim))
        raise KeyError(name)

    def input_specs(self) -> list[TensorSpec]:
        return [self.spec(n) for n in self.module.input_names]

    def output_specs(self) -> list[TensorSpec]:
        return [self.spec(n) for n in self.module.output_names]

    def graphs(self) -> list[Graph]:
        if len(self.parts) == 1:
            return super().graphs()
        out = []
        for j, (lo, hi) in enumerate(self.parts):
            m = DecodeStep(self.bundle.module, self.context, lo, hi).eval()
            out.append(Graph(f"part{j}", m, tuple(self.spec(n) for n in m.input_names),
                             tuple(self.spec(n) for n in m.output_names)))
        return out

    def release_weights(self) -> None:
        self.bundle.release()

    def eager_runner(self, module=None, input_names=None) -> Runner:
        """The eager fp32 step; for a mapped model, part by part with each part's pages handed back before the next
        (the resident set stays near one part instead of the whole model)."""
        if module is not None or self.bundle.weights is None or len(self.parts) == 1:
            return super().eager_runner(module, input_names)

        def part(g):
            run = super(DecodeStepComponent, self).eager_runner(g.module, [s.name for s in g.inputs])

            def released(feed):
                out = run(feed)
                self.release_weights()
                return out
            return released

        return self.chain({g.name: part(g) for g in self.graphs()})

    def describe(self) -> dict:
        return {"name": self.name, "context": self.context, "sliding_window": self.cfg.sliding_window,
                "parts": [list(p) for p in self.parts],
                "inputs": [[s.name, list(s.shape)] for s in self.input_specs()],
                "outputs": [[s.name, list(s.shape)] for s in self.output_specs()],
                "host": "embedding gather, RoPE tables and masks in fp32; new K/V rows written into caches",
                **({"parity_from": self.parity_first_step} if "parity_first_step" in vars(self) else {})}

    # -- host loop -----------------------------------------------------------------------------------
    def new_caches(self) -> dict[str, np.ndarray]:
        return {s.name: np.zeros(s.shape, np.float32) for s in self.input_specs() if "_cache_" in s.name}

    def feed(self, caches: dict, token: int, pos: int) -> dict[str, np.ndarray]:
        if not 0 <= pos < self.context:
            raise ValueError(f"position {pos} outside the context length {self.context}")
        W = self.cfg.sliding_window
        f = {"embeds": self.embedding[token][None, None, :]}
        for tag, (cos, sin) in self.tables.items():
            f[f"cos_{tag}"] = cos[pos][None, None, None, :]
            f[f"sin_{tag}"] = sin[pos][None, None, None, :]
        if FULL in self.types:
            mf = np.full((1, 1, 1, self.context + 1), MASK_VALUE, np.float32)
            mf[..., :pos] = 0.0
            mf[..., -1] = 0.0
            f["mask_full"] = mf
        if SLIDING in self.types:
            ms = np.full((1, 1, 1, W), MASK_VALUE, np.float32)
            ms[..., : min(pos, W - 1)] = 0.0  # ring slots filled so far; all of them once pos >= W - 1
            ms[..., -1] = 0.0
            f["mask_sliding"] = ms
        f.update(caches)
        return f

    def slot(self, layer_type: str, pos: int) -> int:
        """The cache slot position ``pos``'s row is written to: its position (full attention) or a ring slot."""
        return pos if layer_type == FULL else pos % (self.cfg.sliding_window - 1)

    def write(self, caches: dict, outputs: list[np.ndarray], pos: int) -> None:
        for i, lt in enumerate(self.cfg.layer_types):
            slot = self.slot(lt, pos)
            caches[f"k_cache_{i}"][:, :, slot] = outputs[1 + 2 * i][:, :, 0]
            caches[f"v_cache_{i}"][:, :, slot] = outputs[2 + 2 * i][:, :, 0]

    def steps(self, run: Runner, tokens: list[int], n_new: int = 0, max_steps: int | None = None):
        """The host loop, one graph call at a time: feed ``tokens`` (teacher forcing), then extend greedily by ``n_new``.

        Yields ``(feed, outputs, generated)`` after each call and before the new rows are written into the caches,
        so a consumer sees exactly the inputs the graph saw (copy them to keep them)."""
        caches, seq, gen = self.new_caches(), list(tokens), []
        pos = 0
        while pos < len(seq) and (max_steps is None or pos < max_steps):
            f = self.feed(caches, seq[pos], pos)
            o = run(f)
            if pos == len(seq) - 1 and len(gen) < n_new:
                gen.append(int(np.argmax(o[0])))
                if len(gen) < n_new and len(seq) < self.context:
                    seq.append(gen[-1])
            yield f, o, gen
            self.write(caches, o, pos)
            pos += 1

    def run_tokens(self, run: Runner, tokens: list[int], record=None, n_new: int = 0,
                   max_steps: int | None = None) -> tuple[dict[str, np.ndarray], list[int]]:
        """Run the host loop to the end; returns per-output arrays stacked over steps and the greedy tokens.
        ``record(feed)`` sees every step's inputs."""
        outs, gen = [], []
        for f, o, gen in self.steps(run, tokens, n_new, max_steps):
            if record is not None:
                record(f)
            outs.append(o)
        names = [s.name for s in self.output_specs()]
        stacked = {n: np.concatenate([o[i] for o in outs], axis=0) for i, n in enumerate(names)} if outs else {}
        return stacked, gen

    def encode(self, prompt: str, max_prompt_tokens: int) -> list[int]:
        return self.tokenizer.encode(prompt, max_prompt_tokens)

    def graph_for(self, target: str, graph: Graph, scheme) -> nn.Module | None:
        """XNNPACK (``executorch``) takes RMSNorm as a matmul (``graph_forms.RMSNormAsMatMul``); every other target
        exports the graph as it is."""
        return rms_norm_as_matmul(graph.module) if target == "executorch" else None

    def batched_steps(self, run: Runner, seqs: list[list[int]], n_new: list[int]):
        """The host loop for several sequences at once through the eager fp32 step (batch = sequences; the graph's
        layers take any batch). Every row is at the same position each call, so RoPE tables and masks are shared;
        a row that has ended rides along and is ignored. The model's weights are read once per position for all
        rows instead of once per row: at full size that is most of the fp32 reference's and calibration's time.

        Yields ``(pos, active rows, feed, outputs, generated per row)`` before the new rows are written, like ``steps``.
        ``run`` is also handed ``head_rows``, the rows whose logits the loop reads (``head_rows_runner``)."""
        B = len(seqs)
        caches = {k: np.repeat(v, B, axis=0) for k, v in self.new_caches().items()}
        seqs, gens, pos = [list(t) for t in seqs], [[] for _ in seqs], 0
        while any(pos < len(t) for t in seqs):
            active = [b for b in range(B) if pos < len(seqs[b])]
            f = self.feed(caches, 0, pos)
            f["embeds"] = self.embedding[[seqs[b][pos] if pos < len(seqs[b]) else 0 for b in range(B)]][:, None, :]
            choose = [b for b in active if pos == len(seqs[b]) - 1 and len(gens[b]) < n_new[b]]
            o = run({**f, HEAD_ROWS: np.asarray(choose, np.int64)})  # read by ``head_rows_runner``'s module only
            for b in choose:
                gens[b].append(int(np.argmax(o[0][b])))
                if len(gens[b]) < n_new[b] and len(seqs[b]) < self.context:
                    seqs[b].append(gens[b][-1])
            yield pos, active, f, o, gens
            self.write(caches, o, pos)
            pos += 1

    def head_rows_runner(self) -> Runner:
        """The eager fp32 step for ``batched_steps`` loops that read logits only to choose tokens (the sink plan and
        calibration capture): the final norm and LM head run on the rows that choose a token at that step, every
        other row's logits are zeros (``decode_graph.HeadOnRows``); the K/V rows and chosen tokens are the step's."""
        return self.eager_runner(HeadOnRows(self.module), [s.name for s in self.input_specs()] + [HEAD_ROWS])

    @staticmethod
    def row(feed: dict[str, np.ndarray], b: int) -> dict[str, np.ndarray]:
        """Row ``b`` of a batched feed, as the batch-1 graph takes it (shared tables and masks copied)."""
        return {k: (v[b:b + 1] if k == "embeds" or "_cache_" in k else v).copy() for k, v in feed.items()}

    def reference(self, prompts, opts) -> list[Sequence]:
        ids = []
        for p in prompts.prompts:
            ids.append(self.encode(p, opts["max_prompt_tokens"]))
            if len(ids[-1]) + opts["new_tokens"] > self.context:
                raise ValueError(f"prompt of {len(ids[-1])} tokens + {opts['new_tokens']} new exceeds context {self.context}")
        rows: list[list[list[np.ndarray]]] = [[] for _ in ids]
        gens: list[list[int]] = [[] for _ in ids]
        for _, active, _, o, gens in self.batched_steps(self.eager_runner(), ids, [opts["new_tokens"]] * len(ids)):
            for b in active:
                rows[b].append([x[b:b + 1].copy() for x in o])
        names = [s.name for s in self.output_specs()]
        return [Sequence(t + g[:-1], len(t), {n: np.concatenate([o[i] for o in r], axis=0) for i, n in enumerate(names)}, g)
                for t, g, r in zip(ids, gens, rows)]

    def sinks(self, prompts, opts) -> SinkPlan:
        """The calibration prompts' attention-sink positions (``lm_sinks``), measured once per prompt set."""
        key = (prompts.hash, opts["max_prompt_tokens"], opts["new_tokens"], bool(opts.get("calibrate_sinks")))
        if getattr(self, "_sinks", (None,))[0] != key:
            ids = [self.encode(p, opts["max_prompt_tokens"]) for p in prompts.prompts]
            n_new = [max(0, min(opts["new_tokens"], self.context - len(t))) for t in ids]
            rec = None if key[-1] else CaptureRecord(self, len(ids))  # the capture, from the same pass
            self._sinks = (key, sink_plan(self, ids, n_new, keep_sinks=key[-1], on_step=rec))
            self._record = {key: rec} if rec is not None else {}
        return self._sinks[1]

    def indexed_calibration_feeds(self, prompts, opts, keep: set[int], pools: dict | None = None):
        """The samples of ``calibration_feeds`` (same indices), captured with every calibration prompt batched.

        Given ``pools``, each KV cache input is stored as ``Rows`` (which step's fp32 row sits in each slot) into a
        per-sequence pool of the rows the steps wrote, filled once the capture ends: the same arrays, ~30x smaller.
        The samples then come from the sink plan's own pass when it recorded them (``lm_capture``), else from a
        pass of their own."""
        plan = self.sinks(prompts, opts)
        ids = [self.encode(p, opts["max_prompt_tokens"]) for p in prompts.prompts]
        n_new = [max(0, min(opts["new_tokens"], self.context - len(t))) for t in ids]
        ranks = [{p: j for j, p in enumerate(plan.kept(b))} for b in range(len(ids))]
        offsets = np.cumsum([0] + [len(r) for r in ranks])
        index = {(b, p): int(offsets[b] + j) for b, r in enumerate(ranks) for p, j in r.items()}
        if pools is not None:
            rec = self._record.pop(self._sinks[0], None)
            if rec is None:
                rec = CaptureRecord(self, len(ids))
                for pos, active, f, o, _ in self.batched_steps(self.head_rows_runner(), ids, n_new):
                    rec(pos, active, f, o)
            for bp, feed in rec.feeds.items():
                if bp in index and index[bp] in keep:
                    yield index[bp], feed
            pools.update(rec.pools())
            return
        for pos, active, f, o, _ in self.batched_steps(self.head_rows_runner(), ids, n_new):
            for b in active:
                if (b, pos) in index and index[b, pos] in keep:
                    yield index[b, pos], self.row(f, b)

    def calibration_feeds(self, prompts, opts) -> Iterator[dict[str, np.ndarray]]:
        """Greedy fp32 runs over the calibration prompts; every graph input the loop produces at a position that is
        not an attention sink (``lm_sinks``: position 0, outlier tokens) is a sample."""
        plan = self.sinks(prompts, opts)
        for b, p in enumerate(prompts.prompts):
            ids = self.encode(p, opts["max_prompt_tokens"])
            n_new = max(0, min(opts["new_tokens"], self.context - len(ids)))
            for pos, (f, _, _) in enumerate(self.steps(self.eager_runner(), ids, n_new)):  # streamed
                if pos not in plan.excluded[b]:
                    yield {k: v.copy() for k, v in f.items()}

    def trace(self, run: Runner, reference: list[Sequence], max_steps: int | None,
              forced_only: bool = False) -> list[Sequence]:
        """Teacher-forced over each reference sequence (the artifact keeps its own caches and K/V rows), then (unless
        ``forced_only``) free-running greedy from each prompt, while the step budget lasts (teacher forcing first).

        Position 0 is the attention sink (``SINK_NOTE``): in deployment the prefill writes its cache rows, so the
        step's outputs there are the fp32 reference's (not a graph call): it is not compared, takes nothing from the
        budget of graph calls (``parity_first_step``), and the token figures start at position 1
        (``parity.metrics.FIRST_POSITION``)."""
        budget, sink, out = max_steps, self.parity_first_step, []
        for ref in reference:
            if budget is not None and budget <= 0:
                break
            if ref.n_prompt <= sink:  # the artifact's first call must read a prompt token (greedy figures are its own)
                raise ValueError(f"parity_from {sink} needs parity prompts longer than that: one has {ref.n_prompt} "
                                 "tokens")
            run = self.sink_from_reference(run, ref)
            outs, _ = self.run_tokens(run, ref.tokens, max_steps=None if budget is None else budget + sink)
            steps = len(next(iter(outs.values())))
            budget = None if budget is None else budget - (steps - sink)
            out.append(Sequence(ref.tokens[:steps], ref.n_prompt, outs))
        if forced_only:
            return out
        for ref, seq in zip(reference, out):
            if budget is not None and budget < len(ref.tokens) - sink:
                break
            seq.generated = free_run(self, run, ref, seq)
            budget = None if budget is None else budget - (len(ref.tokens) - sink)
        return out

    def sink_from_reference(self, run: Runner, ref: Sequence) -> Runner:
        """``run`` with the calls before ``parity_first_step`` (position 0, or every row before ``parity_from``)
        answered by ``ref``'s fp32 outputs: the rows a prefill writes in deployment."""
        names, calls = [s.name for s in self.output_specs()], iter(range(1 << 62))

        def answered(feed):
            i = next(calls)
            return [ref.outputs[n][i:i + 1].copy() for n in names] if i < self.parity_first_step else run(feed)
        return answered

    def calibration_steps(self, prompts, opts) -> int:
        """How many samples ``calibration_feeds`` yields (so a subset can be chosen while streaming)."""
        return self.sinks(prompts, opts).total

    def calibration_note(self, prompts, opts) -> dict:
        return {"attention_sinks": self.sinks(prompts, opts).note(), "parity": SINK_NOTE}
