"""The decode step and prefill of a DecoderLM-protocol model (``decoder_lm``) in the IO form Qualcomm's Genie runtime
drives: the graph, the choice of RoPE inputs, a host that fills the inputs the way Genie does, and the adapter that
runs a Genie-form graph under the decode step's own host loop (so parity traces it like any other artifact).

Genie's contract (``runtimes.genie`` measures it): ``input_ids`` int32 [1,AR] (the embedding gather is in the graph),
``attention_mask`` [1,1,AR,C] that Genie fills with 0 (attend) / ``GENIE_MASK`` (do not), ``position_ids_cos`` /
``position_ids_sin`` [1,1,AR,hd/2] (Genie computes them from ``rope-theta``), per layer ``past_key_{i}_in``
[nkv,1,hd,C-AR] (K transposed) and ``past_value_{i}_in`` [nkv,1,C-AR,hd] -> ``logits`` [1,AR,V],
``past_key_{i}_out`` [nkv,1,hd,AR], ``past_value_{i}_out`` [nkv,1,AR,hd]. Genie keeps one linear cache: position p's
row in past slot p, the mask's first C-AR columns the past slots and its last AR columns the call's own rows; the
slots not yet written hold whatever was there (not zeros: measured), so the graph zeroes every slot no row sees.

Inside the graph:
- the mask is floored at ``MASK_VALUE``, so Genie's -1000 enters the layers as the project's -100 (16-bit
  activation ranges stay tight) and any fill at or below -100 means the same;
- each row's position is the number of slots it may see minus one (``valid = 1 + mask / 100``, summed);
- a layer type whose RoPE equals Genie's table (rotary over all of head_dim, base ``rope-theta``, no scaling) takes
  Genie's cos/sin (half width, repeated for rotate-half); any other (Spark's full layers: base 5e6 over a quarter of
  head_dim; a scaled RoPE) gathers its own fp64-computed table at that position;
- a sliding layer masks every slot with ``W`` or more visible slots after it (``valid @ U``, U the constant strict
  triangle [C, C]): it attends to itself and the ``W - 1`` positions before it over Genie's linear cache, as the
  model does. Cost: one [AR, C] x [C, C] matmul per sliding layer type and a C x C constant (64 KiB at C = 128).
"""
from __future__ import annotations

import hashlib

import numpy as np
import torch
import torch.nn as nn

from ..errors import UnsupportedError
from ..schemes import QdqPolicy
from ..blocks.layers import FULL, MASK_VALUE, SLIDING, rope_inv_freq, rope_table
from .base import Graph, Runner, TensorSpec
from .decoder_qdq import genie_prompt_qdq_policy, genie_token_qdq_policy
from .genie_host import GENIE_MASK, GenieHost  # noqa: F401 (the Genie contract of this module, re-exported)

TYPES = (FULL, SLIDING)  # layer types, in the order Genie's table is offered to them

MAX_SLIDING_CONTEXT = 2048  # the window's constant triangle is C x C fp32: 16 MiB at 2048


def genie_theta(inv_freq: np.ndarray, head_dim: int) -> int | None:
    """The integer ``rope-theta`` whose Genie table (``rope_inv_freq(theta, head_dim)``) is ``inv_freq``, or None."""
    inv = np.asarray(inv_freq, np.float64)
    if len(inv) != head_dim // 2 or len(inv) < 2:
        return None
    theta = float(round(inv[1] ** (-head_dim / 2)))
    if theta < 1 or not np.allclose(rope_inv_freq(theta, head_dim), inv, rtol=1e-9, atol=0):
        return None
    return int(theta)


def rope_plan(cfg) -> tuple[int, dict[str, bool]]:
    """``(rope-theta for Genie, {layer type: takes Genie's cos/sin})``: Genie's table is the one of the first layer type
    (in ``TYPES`` order) it can express; the others gather their own. A model none of whose layer types Genie can
    express is refused (one line)."""
    types = [lt for lt in TYPES if lt in cfg.layer_types]
    thetas = {lt: genie_theta(cfg.inv_freq(lt), cfg.head_dim) for lt in types}
    chosen = next((thetas[lt] for lt in types if thetas[lt] is not None), None)
    if chosen is None:
        raise UnsupportedError(f"genie: no layer type of this model has a RoPE Genie can compute (rotary over all "
                               f"{cfg.head_dim} dims of one integer base, no scaling): "
                               f"{ {lt: cfg.rotary_dim(lt) for lt in types} }")
    return chosen, {lt: thetas[lt] == chosen for lt in types}


class GenieStep(nn.Module):
    """Layers ``lo..hi-1`` of a DecoderLM for ``ar`` rows over Genie's cache of ``context`` slots (module docstring).
    The first part reads ``input_ids``; a later part reads ``hidden_{lo}`` [1,AR,H], which the part before writes."""

    def __init__(self, lm, context: int, ar: int, lo: int = 0, hi: int | None = None, k_transposed: bool = True):
        super().__init__()
        cfg = lm.config
        self.cfg, self.context, self.ar, self.k_transposed = cfg, context, ar, k_transposed
        self.lo, self.hi = lo, cfg.num_hidden_layers if hi is None else hi
        self.first, self.last = self.lo == 0, self.hi == cfg.num_hidden_layers
        self.layers = nn.ModuleList(lm.model.layers[self.lo:self.hi])
        self.embedding = lm.input_embedding() if self.first else None
        self.norm, self.lm_head = (lm.model.norm, lm.lm_head) if self.last else (None, None)
        self.theta, self.genie_rope = rope_plan(cfg)
        present = {l.layer_type for l in self.layers}
        own = [lt for lt in TYPES if lt in present and not self.genie_rope[lt]]
        for lt in own:  # the table of a layer type Genie cannot compute, gathered at each row's position
            cos, sin = rope_table(cfg.inv_freq(lt), np.arange(context))
            self.register_buffer(f"cos_{lt}", torch.from_numpy(cos), persistent=False)
            self.register_buffer(f"sin_{lt}", torch.from_numpy(sin), persistent=False)
        self.own = own
        if SLIDING in present:
            if context > MAX_SLIDING_CONTEXT:
                raise UnsupportedError(f"genie: sliding layers over a context of {context} need a {context}^2 window "
                                       f"constant; at most {MAX_SLIDING_CONTEXT} is supported")
            k = torch.arange(context)
            self.register_buffer("after", (k[:, None] > k[None, :]).float(), persistent=False)
        self.register_buffer("floor", torch.tensor(MASK_VALUE), persistent=False)
        self.x_name = "input_ids" if self.first else f"hidden_{self.lo}"
        uses_genie = any(self.genie_rope[lt] for lt in present)
        self.input_names = ([self.x_name, "attention_mask"] +
                            (["position_ids_cos", "position_ids_sin"] if uses_genie else []) +
                            [f"past_{kv}_{i}_in" for i in range(self.lo, self.hi) for kv in ("key", "value")])
        self.output_names = (["logits" if self.last else f"hidden_{self.hi}"] +
                             [f"past_{kv}_{i}_out" for i in range(self.lo, self.hi) for kv in ("key", "value")])

    def forward(self, *inputs):
        env = dict(zip(self.input_names, inputs))
        x = self.embedding(env["input_ids"]) if self.first else env[self.x_name]
        # Genie's fill -> the project's -100 (a Max, not a Clip: onnxruntime's QDQ quantizer leaves a Clip's graph
        # input unquantized, which the HTP refuses; Genie writes nothing above 0)
        mask = torch.maximum(env["attention_mask"], self.floor)
        valid = 1.0 + mask * (1.0 / -MASK_VALUE)                              # 1 where a row may look, else 0
        tables, masks = {}, {FULL: mask}
        if "position_ids_cos" in env:
            cos, sin = env["position_ids_cos"], env["position_ids_sin"]      # [1,1,AR,hd/2]
            tables.update({lt: (torch.cat((cos, cos), -1), torch.cat((sin, sin), -1))
                           for lt in TYPES if self.genie_rope.get(lt)})
        if self.own:
            pos = torch.clamp(valid.sum(-1) - 1.0, 0.0, float(self.context - 1))   # [1,1,AR]
            # + 0.25 before the cast (which truncates): a quantized Round's output lands a code below the integer
            # (16.9995 -> 16, measured on CPU-QDQ); exact in fp32 and in fp16 up to the largest context
            idx = (torch.round(pos) + 0.25).to(torch.int64)[0, 0]
            for lt in self.own:
                tables[lt] = (getattr(self, f"cos_{lt}")[idx][None, None], getattr(self, f"sin_{lt}")[idx][None, None])
        if any(l.layer_type == SLIDING for l in self.layers):
            seen_after = torch.matmul(valid, self.after)                      # visible slots after each slot
            # a comparison, not a clamp of seen_after - (W - 1): onnxruntime's QDQ quantizer folds that Clip into the
            # Sub's output encoding, and the HTP does not saturate a result 15 x the encoding's range (measured)
            outside = seen_after > float(self.cfg.sliding_window) - 0.5
            masks[SLIDING] = torch.where(outside, self.floor, mask)
        # Genie leaves unwritten slots as they are (garbage, measured): a slot no row sees is zeroed, never used
        P = self.context - self.ar
        written = torch.amax(valid[0, 0, :, :P], dim=0) > 0.5                # [P]
        new = []
        for i, layer in zip(range(self.lo, self.hi), self.layers):
            lt = layer.layer_type
            if self.k_transposed:
                k_in = torch.where(written.view(1, 1, 1, P), env[f"past_key_{i}_in"], 0.0)
                k_cache = k_in.permute(1, 0, 3, 2)                           # [nkv,1,hd,P] -> [1,nkv,P,hd]
            else:
                k_cache = torch.where(written.view(1, 1, P, 1), env[f"past_key_{i}_in"], 0.0).transpose(0, 1)
            v_in = torch.where(written.view(1, 1, P, 1), env[f"past_value_{i}_in"], 0.0)
            v_cache = v_in.transpose(0, 1)                                   # [nkv,1,P,hd] -> [1,nkv,P,hd]
            cos, sin = tables[lt]
            x, k, v = layer(x, cos, sin, masks[lt], k_cache, v_cache)
            new += [k.permute(1, 0, 3, 2) if self.k_transposed else k.transpose(0, 1), v.transpose(0, 1)]
        return (self.lm_head(self.norm(x)) if self.last else x, *new)


def genie_spec(cfg, context: int, ar: int, name: str) -> TensorSpec:
    nkv, hd = cfg.num_key_value_heads, cfg.head_dim
    if name == "input_ids":
        return TensorSpec(name, (1, ar), "int32")
    if name == "attention_mask":
        return TensorSpec(name, (1, 1, ar, context))
    if name in ("position_ids_cos", "position_ids_sin"):
        return TensorSpec(name, (1, 1, ar, hd // 2))
    if name == "logits":
        return TensorSpec(name, (1, ar, cfg.vocab_size))
    if name.startswith("hidden_"):
        return TensorSpec(name, (1, ar, cfg.hidden_size))
    kv, _, rest = name[len("past_"):].partition("_")
    io = rest.rpartition("_")[2]
    n = context - ar if io == "in" else ar
    return TensorSpec(name, (nkv, 1, hd, n) if kv == "key" else (nkv, 1, n, hd))


def token_index(embedding: np.ndarray) -> dict[bytes, int]:
    """Embedding row bytes -> the first token id with that row (tokens with equal rows compute the same function)."""
    out: dict[bytes, int] = {}
    for i in range(len(embedding)):
        out.setdefault(hashlib.blake2b(embedding[i].tobytes(), digest_size=16).digest(), i)
    return out


def step_feed_converter(comp, names: list[str], index: dict[bytes, int] | None = None, ar: int = 1):
    """``convert(feed) -> Genie feed``: the inputs Genie gives the AR-``ar`` graph (inputs ``names``; AR-N: the
    position in the call's first row, the other rows padding as Genie pads them) for the call the decode step's feed
    ``feed`` (``DecodeStepComponent.feed``) makes: the token from its embedding row, the position from its
    RoPE table row, the past rows from the step's caches (full layers: slot = position; sliding: the ring's last
    ``W - 1`` positions, earlier past slots zero, which the graph's window mask never reads), mask 0 / -1000 and
    cos/sin of rope-theta as Genie fills them; past slots not yet written are zero."""
    cfg, C = comp.cfg, comp.context
    index = token_index(comp.embedding) if index is None else index
    tag, (cos_t, _) = next(iter(comp.tables.items()))  # the step's first RoPE table and its input name's suffix
    host = GenieHost(cfg, C, rope_plan(cfg)[0])
    W = cfg.sliding_window

    def convert(feed):
        token = index[hashlib.blake2b(np.ascontiguousarray(feed["embeds"][0, 0]).tobytes(), digest_size=16).digest()]
        (pos,) = np.nonzero((cos_t == feed[f"cos_{tag}"][0, 0, 0]).all(-1))[:1]
        pos = int(pos[0])
        keys, vals = [], []
        for i, lt in enumerate(cfg.layer_types):
            kc, vc = feed[f"k_cache_{i}"][0], feed[f"v_cache_{i}"][0]   # [nkv, slots, hd]
            k = np.zeros((cfg.num_key_value_heads, pos, cfg.head_dim), np.float32)
            v = np.zeros_like(k)
            qs = np.arange(pos) if lt == FULL else np.arange(max(0, pos - (W - 1)), pos)
            slots = qs if lt == FULL else qs % (W - 1)
            k[:, qs], v[:, qs] = kc[:, slots], vc[:, slots]
            keys.append(k)
            vals.append(v)
        return host.feed(names, ar, [token], pos, keys, vals)

    return convert


def step_adapter(comp, names: list[str], run: Runner, index: dict[bytes, int] | None = None) -> Runner:
    """A runner over the decode step's feeds that executes the Genie-form AR-1 graph ``run`` (inputs ``names``) on
    the inputs Genie gives it (``step_feed_converter``) and returns the decode step's outputs. So the Genie graph is
    traced, compared and gated under the same host loop as every decode step."""
    convert = step_feed_converter(comp, names, index)

    def adapted(feed):
        o = run(convert(feed))
        out = [o[0]]
        for i in range(comp.cfg.num_hidden_layers):
            out += [o[1 + 2 * i].transpose(1, 0, 3, 2), o[2 + 2 * i].transpose(1, 0, 2, 3)]
        return out

    return adapted


class GenieGraph(Graph):
    """A Genie-form graph: example inputs in each input's own dtype (``input_ids`` int32)."""

    def example_inputs(self) -> tuple[torch.Tensor, ...]:
        return tuple(torch.zeros(s.shape, dtype=getattr(torch, s.dtype)) for s in self.inputs)


def genie_graphs(comp, ar: int, prefix: str) -> list[GenieGraph]:
    """The Genie-form graphs of decode-step component ``comp`` (a ``DecodeStepComponent``) for ``ar`` rows, one per
    part of ``comp.parts``, named ``{prefix}_{k}_of_{n}`` (Genie orders a variant's parts by that suffix); a part
    hands the next ``hidden_{layer}`` [1,AR,H]."""
    cfg, C, n = comp.cfg, comp.context, len(comp.parts)
    out = []
    for k, (lo, hi) in enumerate(comp.parts):
        m = GenieStep(comp.bundle.module, C, ar, lo, hi).eval()
        out.append(GenieGraph(f"{prefix}_{k + 1}_of_{n}", m, tuple(genie_spec(cfg, C, ar, s) for s in m.input_names),
                              tuple(genie_spec(cfg, C, ar, s) for s in m.output_names)))
    return out


def chain_runner(graphs: list[Graph], runners: dict[str, Runner]) -> tuple[list[str], Runner]:
    """(input names, runner) of a variant's parts chained by tensor name: outputs logits then every layer's K, V."""
    names = list(dict.fromkeys(s.name for g in graphs for s in g.inputs if not s.name.startswith("hidden_")))
    outs = ["logits"] + [s.name for g in graphs for s in g.outputs if s.name.startswith("past_")]

    def run(feed):
        env = dict(feed)
        for g in graphs:
            env.update(zip((s.name for s in g.outputs), runners[g.name]({s.name: env[s.name] for s in g.inputs})))
        return [env[n] for n in outs]
    return names, run


class GenieForm:
    """What the ``genie`` target reads from a decode-step component (``DecodeStepComponent.genie``): the Genie-form
    graphs and runners, the RoPE plan and the sizes ``genie_config.json`` names (no target imports a building
    block)."""

    def __init__(self, comp):
        if getattr(comp, "rows", None) is not None:  # an AR-N prefill component
            raise UnsupportedError(f"target genie: component {comp.name} is not a decoder LM's decode_step (Genie "
                                   "bundles are built from the decode step: list `components: [decode_step]` on the "
                                   "build)")
        self.comp, cfg = comp, comp.cfg
        self.theta, self.plan = rope_plan(cfg)
        self.context, self.vocab, self.head_dim = comp.context, cfg.vocab_size, cfg.head_dim
        self.window = cfg.sliding_window if SLIDING in self.plan else None
        if self.window and self.context > MAX_SLIDING_CONTEXT:
            raise UnsupportedError(f"genie: sliding layers over a context of {self.context} need a "
                                   f"{self.context}^2 window constant; at most {MAX_SLIDING_CONTEXT} is supported")
        self.parts, self.tokenizer = len(comp.parts), comp.tokenizer

    def graphs(self, ar: int, prefix: str) -> list[GenieGraph]:
        return genie_graphs(self.comp, ar, prefix)

    def runner(self, graphs: list[Graph], runners: dict[str, Runner]) -> Runner:
        """The decode step's runner over the chained Genie-form AR-1 ``graphs`` (``step_adapter``)."""
        names, run = chain_runner(graphs, runners)
        return step_adapter(self.comp, names, run)

    def release(self) -> None:
        self.comp.release_weights()

    def qdq_policy(self, graph_name: str, module, scheme) -> QdqPolicy | None:
        """The token generator (AR-1): ``decoder_qdq.genie_token_qdq_policy`` (the decode step's: int16 down/v/head,
        searched int8 scales, widened ranges, a layer's cache input and new row on one encoding; residual Adds and
        RMSNorms float). The prompt processor (AR-N), which computes position 0 (the attention sink) in Genie:
        ``decoder_qdq.genie_prompt_qdq_policy`` (the same weights and float ops; ranges from Genie's prompt calls,
        sink included, no margin). Both are None for a scheme the decoder policy is not for."""
        return genie_token_qdq_policy(scheme) if module.ar == 1 else genie_prompt_qdq_policy(scheme)

    def prompt_ids(self, prompts, max_prompt_tokens: int) -> list[list[int]]:
        """The calibration prompts (a ``PromptSet``) as token ids, as the decode step's calibration encodes them."""
        return [self.comp.encode(p, max_prompt_tokens) for p in prompts.prompts]

    def calibration_feeds(self, samples, graphs: list[Graph], graph: str, prompt_ids: list[list[int]] | None = None):
        """Graph ``graph``'s inputs (of the chained Genie-form ``graphs``) for calibration, a later part's
        ``hidden_*`` input from the eager fp32 parts before it.

        AR-1 (the token generator): every sample of the decode step's calibration set ``samples``, as Genie gives
        them for the same position (``step_feed_converter``: the same sink-free positions; past slots not yet
        written zero, as the graph makes them). AR-N (the prompt processor, the program that computes position 0,
        the attention sink: Genie sends every prompt through it): every call Genie makes over each calibration
        prompt ``prompt_ids`` (``GenieHost.prompt_calls``, eager fp32), row 0 = position 0 included."""
        names = chain_runner(graphs, {})[0]
        target = next(g for g in graphs if g.name == graph)
        ar = next(s.shape[2] for s in target.inputs if s.name == "attention_mask")
        before = [g for g in graphs[:[g.name for g in graphs].index(graph)]]
        runs = [self.comp.eager_runner(g.module, [s.name for s in g.inputs]) for g in before]
        if ar == 1:
            convert = step_feed_converter(self.comp, names, ar=ar)
            feeds = (convert(f) for f in samples)
        else:
            if not prompt_ids:
                raise UnsupportedError(f"genie: the prompt processor {graph} calibrates on the calibration prompts "
                                       "(it computes position 0), and none were given")
            full = chain_runner(graphs, {g.name: self.comp.eager_runner(g.module, [s.name for s in g.inputs])
                                         for g in graphs})[1]
            host = GenieHost(self.comp.cfg, self.context, self.theta)
            feeds = (f for ids in prompt_ids for f in host.prompt_calls(names, full, ar, ids))
        for env in feeds:
            for g, run in zip(before, runs):
                env.update(zip((s.name for s in g.outputs), run({s.name: env[s.name] for s in g.inputs})))
            yield {s.name: env[s.name] for s in target.inputs}
