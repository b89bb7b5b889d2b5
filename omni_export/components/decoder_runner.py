"""A DecoderLM-protocol model (``decoder_lm``) in the two IO forms that LLM runtimes drive on their own, built from
its ``decode_step`` component (so every decoder family gets them without declaring anything):

- ``RunnerStep``, ExecuTorch's LLM-runner form (``TextLLMRunner``, ``llama_main``): ``forward(tokens int64 [1,S],
  input_pos int64 [1]) -> logits [1,1,V]`` (the last row's), any S from 1 to ``max_seq_len`` (the runner feeds a prompt
  in one call), the embedding gather and RoPE rows computed in the graph from ``input_pos``, and every layer's K/V
  cache a buffer [1, context, n_kv, head_dim] that ExecuTorch's LLM kernels (``executorch.extension.llm.custom_ops``,
  as ``export_llama`` uses them) write in place at ``input_pos..input_pos+S-1`` (``llama::update_cache``) and attend
  over up to the last new row (``llama::custom_sdpa``, causal from ``input_pos``): ``CacheAttention``.
- ``GenaiStep``, onnxruntime-genai's decoder form: ``input_ids`` [1,S], ``attention_mask`` [1,P+S], ``position_ids``
  [1,S] and ``past_key_values.N.key/value`` [1,nkv,P,hd] -> ``logits`` [1,S,V] and ``present.N.key/value``
  [1,nkv,P+S,hd] (past and new rows concatenated in the graph; GenAI's ``past_present_share_buffer`` false).

A sliding layer keeps the full-length cache; its window is masked in the graph (a row at position p sees the
positions p - W + 1 .. p; in the runner form a [S, context] mask computed from ``input_pos`` that ``custom_sdpa``
applies over the whole cache), so positions past the window need nothing from the host.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import MissingDependency, UnsupportedError
from ..blocks.graph_forms import RMSNormAsMatMul, of_type, swap_modules
from ..blocks.layers import FULL, MASK_VALUE, SLIDING, Attention, DecoderLayer, rope_table
from .base import Graph, TensorSpec

TAGS = {FULL: "full", SLIDING: "sliding"}  # layer type -> its tables' suffix (``decoder_lm.TAGS``, not imported:
# decoder_lm imports this module, ``RuntimeFormsOf``)


class RuntimeFormsOf:
    """Mixin of ``decoder_lm.DecodeStepComponent``: ``runtime_forms()``, the step in its runtimes' own LLM forms."""

    def runtime_forms(self) -> "RuntimeForms":
        return RuntimeForms(self)


class RuntimeForms:
    """What the ``executorch_llm`` and ``onnx_genai`` targets take from a decode step (``DecodeStepComponent.
    runtime_forms``): the graphs in each runtime's form, the runner's metadata, GenAI's inputs of a step's feed."""

    def __init__(self, comp):
        if len(comp.parts) != 1:
            raise UnsupportedError(f"the decode step is split into {len(comp.parts)} parts; the runtimes' own LLM "
                                   "forms are one graph (parts=1)")
        self.comp = comp
        self.cfg, self.context, self.tokenizer = comp.cfg, comp.context, comp.tokenizer

    def runner_module(self, scheme) -> "RunnerStep":
        return runner_module(self.comp, scheme)

    def runner_metadata(self, max_seq_len: int, eos_ids: list[int]) -> dict:
        return runner_metadata(self.comp, max_seq_len, eos_ids)

    def genai_module(self) -> "GenaiStep":
        return GenaiStep(self.comp.bundle.module, self.comp.context).eval()

    def genai_specs(self, past: int, rows: int):
        return genai_specs(self.comp.cfg, past, rows)

    def genai_feed(self, feed: dict):
        return genai_feed(self.comp, feed)


class _Tables(nn.Module):
    """RoPE tables [context, rot] per layer type present (fp64-computed, fp32), gathered at positions in the graph."""

    def __init__(self, cfg, context: int, types):
        super().__init__()
        for lt in types:
            cos, sin = rope_table(cfg.inv_freq(lt), np.arange(context))
            self.register_buffer(f"cos_{TAGS[lt]}", torch.from_numpy(cos), persistent=False)
            self.register_buffer(f"sin_{TAGS[lt]}", torch.from_numpy(sin), persistent=False)

    def at(self, lt: str, pos: torch.Tensor, rows: bool = False):
        """cos/sin [1, 1, S, rot] (``layers.Attention``'s layout), or [1, S, 1, rot] when ``rows``
        (``RunnerAttention``'s)."""
        t, index = TAGS[lt], ((None, slice(None), None) if rows else (None, None))
        return (getattr(self, f"cos_{t}").index_select(0, pos)[index],
                getattr(self, f"sin_{t}").index_select(0, pos)[index])


def _masks(types, window: int, past_ok: torch.Tensor, past_pos: torch.Tensor, pos: torch.Tensor):
    """Additive masks [1,1,S,P+S] per layer type: row i (position ``pos[i]``) sees the past columns where ``past_ok``
    and its own and earlier new rows; a sliding layer only those within ``window`` positions."""
    S = pos.shape[0]
    own = torch.arange(S, device=pos.device)
    new_ok = own[None, :] <= own[:, None]                                    # [S,S]
    out = {}
    for lt in types:
        p_ok, n_ok = past_ok.expand(S, -1), new_ok
        if lt == SLIDING:
            p_ok = p_ok & (past_pos[None, :] > pos[:, None] - window)
            n_ok = n_ok & (pos[None, :] > pos[:, None] - window)
        m = torch.where(torch.cat((p_ok, n_ok), dim=-1), 0.0, MASK_VALUE)[None, None]
        out[lt] = m
    return out


class CacheAttention:
    """One runner-form layer's attention, handed to the layer as its ``mask`` (``layers.grouped_attention`` calls
    ``attend``): the layer's caches are passed to it empty, so the keys/values it concatenates are this call's new rows
    [B,nkv,S,hd]; ``attend`` writes them into the layer's cache buffers [1, context, nkv, hd] in place at ``start``
    (``llama::update_cache``) and attends over the cache with ``llama::custom_sdpa``: causal from ``start`` (rows past
    ``start + S`` are not read) when ``window_mask`` is None, else that additive [S, context] mask over every row."""

    def __init__(self, k_cache: torch.Tensor, v_cache: torch.Tensor, start, window_mask: torch.Tensor | None):
        self.k_cache, self.v_cache, self.start, self.window_mask = k_cache, v_cache, start, window_mask

    def attend(self, q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor) -> torch.Tensor:
        return self.attend_rows(q.transpose(1, 2), keys.transpose(1, 2), vals.transpose(1, 2)).transpose(1, 2)

    def attend_rows(self, q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor) -> torch.Tensor:
        """``attend`` in the kernels' own layout: q [B,S,nh,hd], keys/vals [B,S,nkv,hd] -> [B,S,nh,hd]."""
        torch.ops.llama.update_cache(keys, self.k_cache, self.start)
        torch.ops.llama.update_cache(vals, self.v_cache, self.start)
        return torch.ops.llama.custom_sdpa(q, self.k_cache, self.v_cache, self.start, self.window_mask, 0.0,
                                           self.window_mask is None)


def llm_kernels() -> None:
    """Registers ExecuTorch's LLM kernels (``llama::update_cache``, ``llama::custom_sdpa``) with torch: the runner form
    is traced and run eagerly through them."""
    try:
        import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401
    except ImportError as e:
        raise MissingDependency(f"the ExecuTorch runner form needs executorch's LLM kernels: {e}") from None


class RunnerStep(nn.Module):
    """ExecuTorch's LLM-runner form of a DecoderLM (module docstring). ``layers``/``norm``: the layers and final
    norm in the form the backend takes (``Component.graph_for``), else the model's own."""

    def __init__(self, lm, context: int, layers: nn.ModuleList | None = None, norm: nn.Module | None = None):
        super().__init__()
        llm_kernels()
        cfg = lm.config
        self.cfg, self.context = cfg, context
        self.embedding = lm.input_embedding()
        self.layers = layers if layers is not None else lm.model.layers
        self.norm = norm if norm is not None else lm.model.norm
        self.lm_head = lm.lm_head
        self.types = [lt for lt in TAGS if lt in cfg.layer_types]
        self.tables = _Tables(cfg, context, self.types)
        shape = (1, context, cfg.num_key_value_heads, cfg.head_dim)
        for i in range(cfg.num_hidden_layers):
            self.register_buffer(f"k_cache_{i}", torch.zeros(shape), persistent=False)
            self.register_buffer(f"v_cache_{i}", torch.zeros(shape), persistent=False)
        # what each layer is handed as its caches: no rows (CacheAttention owns the cache)
        self.register_buffer("no_rows", torch.zeros(1, cfg.num_key_value_heads, 0, cfg.head_dim), persistent=False)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        S = tokens.shape[1]
        start = input_pos[0].item()
        torch._check(start >= 0)
        torch._check(start + S <= self.context)
        pos = input_pos + torch.arange(S, device=tokens.device)              # [S] positions of this call's rows
        window = None
        if SLIDING in self.types:                                            # row i sees pos_i - W + 1 .. pos_i
            cols = torch.arange(self.context, device=tokens.device)
            ok = (cols[None, :] <= pos[:, None]) & (cols[None, :] > pos[:, None] - self.cfg.sliding_window)
            window = torch.where(ok, 0.0, MASK_VALUE)
        tables, last = {}, False
        x = self.embedding(tokens)
        for i, layer in enumerate(self.layers):
            kc, vc = getattr(self, f"k_cache_{i}"), getattr(self, f"v_cache_{i}")
            own = getattr(layer, "self_attn", None)
            rows = isinstance(own, RunnerAttention)
            key = (layer.layer_type, rows and own.fused)                     # the layers' head counts are the same
            if key not in tables:
                cos, sin = self.tables.at(layer.layer_type, pos, rows)
                tables[key] = own.head_tables(cos, sin) if rows else (cos, sin)
            cos, sin = tables[key]
            attn = CacheAttention(kc, vc, start, window if layer.layer_type == SLIDING else None)
            last = rows and isinstance(layer, DecoderLayer) and i == len(self.layers) - 1
            if last:
                x = _last_row(layer, x, cos, sin, attn)
            else:
                x, _, _ = layer(x, cos, sin, attn, self.no_rows, self.no_rows)
        return self.lm_head(self.norm(x if last else x[:, -1:, :]))


def _last_row(layer: DecoderLayer, x: torch.Tensor, cos, sin, attn: CacheAttention) -> torch.Tensor:
    """``layer(x)``'s last row [B,1,H] (the only one the logits read): every row's K/V written and attended, the
    output projection, residuals and MLP on the last row alone (``DecoderLayer.forward`` on that row)."""
    a, _, _ = layer.self_attn(layer.input_layernorm(x), cos, sin, attn, None, None, last_row=True)
    h = x[:, -1:, :] + a
    return h + layer.mlp(layer.post_attention_layernorm(h))


def runner_metadata(comp, max_seq_len: int, eos_ids: list[int]) -> dict:
    """The constant methods ExecuTorch's LLM runner reads (``get_max_seq_len`` is required)."""
    cfg = comp.cfg
    return {"get_max_seq_len": int(max_seq_len), "get_max_context_len": int(comp.context), "use_kv_cache": True,
            "enable_dynamic_shape": True, "use_sdpa_with_kv_cache": True, "get_eos_ids": [int(e) for e in eos_ids],
            "get_vocab_size": int(cfg.vocab_size), "get_n_layers": int(cfg.num_hidden_layers)}


class RMSNormAsLinear(nn.Module):
    """``graph_forms.RMSNormAsMatMul`` with its mean of squares as ``F.linear`` by the [1, H] row of 1/H. The runner
    form's rows are dynamic: a matmul of [1, S, H] by a [H, 1] constant decomposes to views that name S, which XNNPACK
    does not take (four per layer cut the program into more delegates), while ``linear`` stays one op it takes.
    Same function in fp32; only summation order differs."""

    def __init__(self, norm: RMSNormAsMatMul):
        super().__init__()
        self.weight = norm.weight
        self.register_buffer("avg_row", norm.avg.detach().t().contiguous())    # [1, H]
        self.register_buffer("eps", norm.eps)

    def forward(self, x):
        return x * torch.rsqrt(F.linear(x * x, self.avg_row) + self.eps) * self.weight


def _norms_as_linear(m: nn.Module) -> nn.Module:
    """``m`` with its ``RMSNormAsMatMul`` s (itself included) as ``RMSNormAsLinear``, in place: ``m`` is the form the
    component built for the target (``Component.graph_for``), never the model's own modules."""
    if isinstance(m, RMSNormAsMatMul):
        return RMSNormAsLinear(m)
    return swap_modules(m, of_type(RMSNormAsMatMul), RMSNormAsLinear, copy_first=False)


class RunnerAttention(nn.Module):
    """``layers.Attention`` (full rotary dims) in the runner form, over ``CacheAttention``:

    - q/k/v stay [B,S,h,hd], the layout ``llama::update_cache`` and ``llama::custom_sdpa`` take (no transposes);
    - RoPE's rotate-half is ``F.linear`` by a constant signed permutation [hd, hd] (``half_turn``): XNNPACK takes it,
      while ``layers.rotate`` takes the halves as slices, which XNNPACK does not take with a dynamic row count (four
      portable ``slice_copy`` per layer between two delegates);
    - without per-head q/k norms (``fused``), the q, k and v projections are one ``F.linear`` (their weights stacked)
      and RoPE runs once over all its heads, with tables that leave the v heads as they are (``head_tables``: cos 1,
      sin 0); q, k and v are then sliced off by head, after the delegate. One projection and one rotation a layer
      instead of three and two: XNNPACK pays a fixed cost per operator on every call.

    Same function in fp32: each output of the permutation is one input times +-1 plus zeros, exact, and v * 1 +
    rotate_half(v) * 0 is v, so ``x * cos + rotate_half(x) * sin`` is what ``layers.rotate`` computes; each stacked
    projection's outputs are the same dot products. Returns the output and the new K/V rows [B,S,nkv,hd] (the runner
    form keeps them in its caches; ``RunnerStep`` drops them)."""

    def __init__(self, attn: Attention):
        super().__init__()
        self.nh, self.nkv, self.hd = attn.nh, attn.nkv, attn.hd
        self.o_proj, self.q_norm, self.k_norm = attn.o_proj, attn.q_norm, attn.k_norm
        self.fused = isinstance(attn.q_norm, nn.Identity) and isinstance(attn.k_norm, nn.Identity)
        if self.fused:
            projs = (attn.q_proj, attn.k_proj, attn.v_proj)
            bias = projs[0].bias is not None
            self.qkv_proj = nn.Linear(projs[0].in_features, sum(p.out_features for p in projs), bias=bias)
            with torch.no_grad():
                self.qkv_proj.weight.copy_(torch.cat([p.weight for p in projs]))
                if bias:
                    self.qkv_proj.bias.copy_(torch.cat([p.bias for p in projs]))
            rotated = torch.zeros(1, 1, self.nh + 2 * self.nkv, 1)
            rotated[:, :, :self.nh + self.nkv] = 1.0                        # q and k heads; v heads kept
            self.register_buffer("rotated", rotated, persistent=False)
            self.register_buffer("kept", 1.0 - rotated, persistent=False)
        else:
            self.q_proj, self.k_proj, self.v_proj = attn.q_proj, attn.k_proj, attn.v_proj
        half = self.hd // 2
        turn = torch.zeros(self.hd, self.hd)                # F.linear weight [out, in]: out = (-x[half:], x[:half])
        turn[torch.arange(half), torch.arange(half) + half] = -1.0
        turn[torch.arange(half) + half, torch.arange(half)] = 1.0
        self.register_buffer("half_turn", turn, persistent=False)

    def head_tables(self, cos: torch.Tensor, sin: torch.Tensor):
        """cos/sin [B,S,1,hd] -> the tables ``forward`` takes: per head [B,S,nh+2nkv,hd] when ``fused`` (v heads:
        cos 1, sin 0; exact), else as they are."""
        if not self.fused:
            return cos, sin
        return cos * self.rotated + self.kept, sin * self.rotated

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return x * cos + F.linear(x, self.half_turn) * sin

    def forward(self, x, cos, sin, attn: CacheAttention, k_cache, v_cache, last_row: bool = False):
        """x [B,S,H]; cos/sin from ``head_tables``; ``attn`` the layer's ``CacheAttention``; the caches handed in
        are unused (``CacheAttention`` owns them). ``last_row``: the output of the last row only [B,1,H]."""
        B, S, _ = x.shape
        nh, nkv = self.nh, self.nkv
        if self.fused:
            qkv = self.rotate(self.qkv_proj(x).view(B, S, nh + 2 * nkv, self.hd), cos, sin)
            q, k, v = qkv[:, :, :nh], qkv[:, :, nh:nh + nkv], qkv[:, :, nh + nkv:]
        else:
            q = self.rotate(self.q_norm(self.q_proj(x).view(B, S, nh, self.hd)), cos, sin)
            k = self.rotate(self.k_norm(self.k_proj(x).view(B, S, nkv, self.hd)), cos, sin)
            v = self.v_proj(x).view(B, S, nkv, self.hd)
        o = attn.attend_rows(q, k, v)
        if last_row:
            o = o[:, -1:]
        return self.o_proj(o.reshape(B, o.shape[1], nh * self.hd)), k, v


def _full_rotary(name, m) -> bool:
    return type(m) is Attention and m.rot == m.hd


def runner_module(comp, scheme, target: str = "executorch") -> RunnerStep:
    """The runner form of decode-step ``comp``, its layers and norm in the form the component gives ``target``
    (XNNPACK: RMSNorm as a matmul, here ``RMSNormAsLinear``) when it gives one, its ``layers.Attention`` s (full
    rotary dims) as ``RunnerAttention``: other attentions (Spark's, partial rotary) are kept as they are."""
    lm = comp.bundle.module
    form = comp.graph_for(target, Graph("runner", nn.ModuleDict({"layers": lm.model.layers, "norm": lm.model.norm}),
                                        (), ()), scheme)
    if form is None:
        return RunnerStep(lm, comp.context).eval()
    layers = swap_modules(_norms_as_linear(form["layers"]), _full_rotary, RunnerAttention, copy_first=False)
    return RunnerStep(lm, comp.context, layers, _norms_as_linear(form["norm"])).eval()


class GenaiStep(nn.Module):
    """onnxruntime-genai's decoder form of a DecoderLM (module docstring). Input order: ``input_ids``,
    ``attention_mask``, ``position_ids``, then ``past_key_values.i.key``/``.value`` per layer."""

    def __init__(self, lm, context: int):
        super().__init__()
        cfg = lm.config
        self.cfg, self.context = cfg, context
        self.embedding, self.layers, self.norm, self.lm_head = lm.input_embedding(), lm.model.layers, lm.model.norm, lm.lm_head
        self.types = [lt for lt in TAGS if lt in cfg.layer_types]
        self.tables = _Tables(cfg, context, self.types)
        L = cfg.num_hidden_layers
        self.input_names = (["input_ids", "attention_mask", "position_ids"] +
                            [f"past_key_values.{i}.{kv}" for i in range(L) for kv in ("key", "value")])
        self.output_names = ["logits"] + [f"present.{i}.{kv}" for i in range(L) for kv in ("key", "value")]

    def forward(self, input_ids, attention_mask, position_ids, *past):
        P = past[0].shape[2]
        pos = position_ids[0]
        past_ok = attention_mask[:, :P] > 0                                  # [1,P]
        past_pos = torch.arange(P, device=input_ids.device)                  # GenAI's past slot j holds position j
        masks = _masks(self.types, self.cfg.sliding_window, past_ok, past_pos, pos)
        tables = {lt: self.tables.at(lt, pos) for lt in self.types}
        x, present = self.embedding(input_ids), []
        for i, layer in enumerate(self.layers):
            cos, sin = tables[layer.layer_type]
            kc, vc = past[2 * i], past[2 * i + 1]
            x, k, v = layer(x, cos, sin, masks[layer.layer_type], kc, vc)
            present += [torch.cat((kc, k), dim=2), torch.cat((vc, v), dim=2)]
        return (self.lm_head(self.norm(x)), *present)


def genai_specs(cfg, past: int, rows: int) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """Example IO specs of ``GenaiStep`` at ``rows`` new rows over ``past`` cached ones."""
    nkv, hd, L = cfg.num_key_value_heads, cfg.head_dim, cfg.num_hidden_layers
    ins = [TensorSpec("input_ids", (1, rows), "int64"), TensorSpec("attention_mask", (1, past + rows), "int64"),
           TensorSpec("position_ids", (1, rows), "int64")]
    ins += [TensorSpec(f"past_key_values.{i}.{kv}", (1, nkv, past, hd)) for i in range(L) for kv in ("key", "value")]
    outs = [TensorSpec("logits", (1, rows, cfg.vocab_size))]
    outs += [TensorSpec(f"present.{i}.{kv}", (1, nkv, past + rows, hd)) for i in range(L) for kv in ("key", "value")]
    return tuple(ins), tuple(outs)


def genai_feed(comp, feed: dict) -> tuple[int, int, dict[str, np.ndarray]]:
    """``(token, position, GenAI inputs)`` of one decode-step feed (``DecodeStepComponent.feed``): the token from its
    embedding row, the position from its RoPE row, the past rows from the step's caches (full layers: slot =
    position; sliding: the ring's last ``W - 1`` positions, earlier past rows zero, which the window never reads)."""
    cfg, W = comp.cfg, comp.cfg.sliding_window
    tag = TAGS[comp.types[0]]
    index = getattr(comp, "_runner_token_index", None)
    if index is None:
        emb = comp.embedding
        index = comp._runner_token_index = {emb[i].tobytes(): i for i in range(len(emb) - 1, -1, -1)}
    token = index[np.ascontiguousarray(feed["embeds"][0, 0]).tobytes()]
    (hits,) = np.nonzero((comp.tables[tag][0] == feed[f"cos_{tag}"][0, 0, 0]).all(-1))
    pos = int(hits[0])
    f = {"input_ids": np.array([[token]], np.int64), "attention_mask": np.ones((1, pos + 1), np.int64),
         "position_ids": np.array([[pos]], np.int64)}
    for i, lt in enumerate(cfg.layer_types):
        for kv in ("k", "v"):
            c = feed[f"{kv}_cache_{i}"]
            past = np.zeros((1, cfg.num_key_value_heads, pos, cfg.head_dim), np.float32)
            qs = np.arange(pos) if lt == FULL else np.arange(max(0, pos - (W - 1)), pos)
            past[:, :, qs] = c[:, :, qs if lt == FULL else qs % (W - 1)]
            f[f"past_key_values.{i}.{'key' if kv == 'k' else 'value'}"] = past
    return token, pos, f
