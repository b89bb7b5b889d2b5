"""Spark-X2.5 (model_type ``spark2_5``): an export-friendly fp32 definition.

Hybrid 3:1 sliding/full attention, a head-wise sigmoid output gate, per-layer-type RoPE
(theta and partial rotary factor), exact-GELU gated MLP and a fused q_k_v projection.
Parameter names follow the Hugging Face checkpoint layout, so a checkpoint's state dict
loads without renaming.

The decode step (``SparkDecodeStep``) is the exported graph: static shapes, the token's
embedding gathered on the host, RoPE tables and additive masks prepared on the host in fp32,
caches passed in, and only the new K/V rows passed out. ``SparkHost`` is the one host loop
that drives any runtime (eager, ONNX Runtime, the QNN HTP simulator, ExecuTorch).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MASK_VALUE = -100.0  # additive mask: a small value keeps the 16-bit activation range tight (toolchain notes)
SLIDING, FULL = "sliding_attention", "full_attention"


@dataclass(frozen=True)
class SparkConfig:
    hidden_size: int = 2048
    intermediate_size: int = 6656
    num_hidden_layers: int = 28
    num_attention_heads: int = 8
    num_key_value_heads: int = 2
    head_dim: int = 256
    sliding_window: int = 512
    vocab_size: int = 131072
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = False
    headwise_attn_output_gate: bool = True
    rope_theta_full: float = 5_000_000.0
    partial_rotary_factor_full: float = 0.25
    rope_theta_sliding: float = 10_000.0
    partial_rotary_factor_sliding: float = 1.0
    layer_types: tuple[str, ...] = field(default=())

    def __post_init__(self):
        if not self.layer_types:
            lt = tuple(FULL if (i + 1) % 4 == 0 else SLIDING for i in range(self.num_hidden_layers))
            object.__setattr__(self, "layer_types", lt)
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries, expected {self.num_hidden_layers}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")

    def rotary_dim(self, layer_type: str) -> int:
        f = self.partial_rotary_factor_full if layer_type == FULL else self.partial_rotary_factor_sliding
        return int(self.head_dim * f)

    def rope_theta(self, layer_type: str) -> float:
        return self.rope_theta_full if layer_type == FULL else self.rope_theta_sliding

    @classmethod
    def from_hf(cls, cfg: dict) -> "SparkConfig":
        """Build from a checkpoint's config.json (HF field names)."""
        if cfg.get("model_type") not in (None, "spark2_5"):
            raise ValueError(f"config.json model_type is {cfg.get('model_type')!r}, expected 'spark2_5'")
        kw = {f.name: cfg[f.name] for f in dataclasses.fields(cls) if f.name in cfg and f.name != "layer_types"}
        if "layer_types" in cfg:
            kw["layer_types"] = tuple(cfg["layer_types"])
        if cfg.get("headwise_attn_output_gate") is False:
            raise ValueError("config.json: headwise_attn_output_gate=false is not supported")
        rp = cfg.get("rope_parameters") or {}
        for lt, suffix in ((FULL, "full"), (SLIDING, "sliding")):
            if lt in rp:
                kw[f"rope_theta_{suffix}"] = float(rp[lt].get("rope_theta", kw.get(f"rope_theta_{suffix}", 0) or getattr(cls, f"rope_theta_{suffix}")))
                kw[f"partial_rotary_factor_{suffix}"] = float(rp[lt].get("partial_rotary_factor", 1.0))
        return cls(**kw)

    def to_hf(self) -> dict:
        d = dataclasses.asdict(self)
        for k in ("rope_theta_full", "partial_rotary_factor_full", "rope_theta_sliding", "partial_rotary_factor_sliding"):
            d.pop(k)
        d["layer_types"] = list(self.layer_types)
        d["model_type"] = "spark2_5"
        d["rope_parameters"] = {
            FULL: {"rope_theta": self.rope_theta_full, "partial_rotary_factor": self.partial_rotary_factor_full},
            SLIDING: {"rope_theta": self.rope_theta_sliding, "partial_rotary_factor": self.partial_rotary_factor_sliding},
        }
        return d


PRESETS = {
    # Embedded default: 4 layers (3 sliding + 1 full), a window of 16 that the parity run crosses.
    "tiny": SparkConfig(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=64, sliding_window=16, vocab_size=4096,
                        max_position_embeddings=512),
    "full": SparkConfig(),  # the 1.7B-class defaults of the upstream config class
}


class RMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * w, written as F.rms_norm (a hand-written pow/mean/rsqrt fails HTP finalization)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rot: int) -> torch.Tensor:
    """NeoX (rotate-half) RoPE on the first ``rot`` dims. x: [B, h, S, D]; cos/sin: [B, 1, S, rot]."""
    xr, xp = (x, None) if rot == x.shape[-1] else (x[..., :rot], x[..., rot:])
    x1, x2 = xr[..., : rot // 2], xr[..., rot // 2:]
    out = xr * cos + torch.cat((-x2, x1), dim=-1) * sin
    return out if xp is None else torch.cat((out, xp), dim=-1)


def grouped_attention(q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Softmax attention with grouped-query K/V. q [B,nh,S,hd]; keys/vals [B,nkv,T,hd]; mask [B,1,S,T] additive.

    The ``rep`` query heads sharing a KV head are stacked along the rows, so K/V are never copied (no
    ``repeat_interleave``) and the mask is tiled to match (rows ordered head-in-group, then position). The batched
    matmuls are 3-D ``bmm``: a 4-D ``matmul`` becomes expand + bmm in ``torch.export``, and XNNPACK does not take the
    expand (every layer cut the ExecuTorch program into more delegates)."""
    B, nh, S, hd = q.shape
    nkv, T = keys.shape[1], keys.shape[2]
    rep = nh // nkv
    scores = torch.bmm(q.reshape(B * nkv, rep * S, hd), keys.reshape(B * nkv, T, hd).transpose(1, 2))
    scores = scores.view(B, nkv, rep * S, T) * (1.0 / math.sqrt(hd))
    scores = scores + (mask if rep == 1 or S == 1 else mask.repeat(1, 1, rep, 1))
    probs = torch.softmax(scores, dim=-1).view(B * nkv, rep * S, T)
    return torch.bmm(probs, vals.reshape(B * nkv, T, hd)).view(B, nh, S, hd)


class Attention(nn.Module):
    def __init__(self, cfg: SparkConfig, layer_type: str):
        super().__init__()
        self.cfg, self.layer_type = cfg, layer_type
        self.nh, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.rot = cfg.rotary_dim(layer_type)
        self.q_k_v_proj = nn.Linear(cfg.hidden_size, (self.nh + 2 * self.nkv) * self.hd, bias=False)
        self.g_proj = nn.Linear(cfg.hidden_size, self.nh, bias=False)
        self.out_proj = nn.Linear(self.nh * self.hd, cfg.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask, k_cache, v_cache):
        """x: [B,S,H]; cos/sin: [B,1,S,rot]; mask: [B,1,S,C+S] additive; k/v_cache: [B,nkv,C,hd].

        Returns the output and the new (post-RoPE) K/V rows [B,nkv,S,hd]."""
        B, S, _ = x.shape
        qkv = self.q_k_v_proj(x)
        nq, nk = self.nh * self.hd, self.nkv * self.hd  # slices, not split: every runtime keeps them in one delegate
        q = qkv[..., :nq].view(B, S, self.nh, self.hd).transpose(1, 2)
        k = qkv[..., nq:nq + nk].view(B, S, self.nkv, self.hd).transpose(1, 2)
        v = qkv[..., nq + nk:].view(B, S, self.nkv, self.hd).transpose(1, 2)
        q, k = rotate(q, cos, sin, self.rot), rotate(k, cos, sin, self.rot)
        keys = torch.cat((k_cache, k), dim=2)  # [B,nkv,T,hd], T = C+S
        vals = torch.cat((v_cache, v), dim=2)
        o = grouped_attention(q, keys, vals, mask)  # [B,nh,S,hd]
        gate = torch.sigmoid(self.g_proj(x)).transpose(1, 2).unsqueeze(-1)  # [B,nh,S,1]
        o = (o * gate).transpose(1, 2).reshape(B, S, self.nh * self.hd)
        return self.out_proj(o), k, v


class MLP(nn.Module):
    def __init__(self, cfg: SparkConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.gelu(self.gate_proj(x)) * self.up_proj(x))  # exact (erf) GELU


class Layer(nn.Module):
    def __init__(self, cfg: SparkConfig, layer_type: str):
        super().__init__()
        self.layer_type = layer_type
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_type)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, mask, k_cache, v_cache):
        a, k, v = self.self_attn(self.input_layernorm(x), cos, sin, mask, k_cache, v_cache)
        h = x + a
        return h + self.mlp(self.post_attention_layernorm(h)), k, v


class SparkBackbone(nn.Module):
    def __init__(self, cfg: SparkConfig):
        super().__init__()
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Layer(cfg, t) for t in cfg.layer_types)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class SparkForCausalLM(nn.Module):
    def __init__(self, cfg: SparkConfig):
        super().__init__()
        self.config = cfg
        self.model = SparkBackbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embedding.weight

    def tie_weights(self) -> None:
        """Re-tie the LM head to the embedding after the embedding was assigned (mapped weights)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embedding.weight

    def expected_keys(self) -> dict[str, tuple[int, ...]]:
        keys = {k: tuple(v.shape) for k, v in self.state_dict().items()}
        if self.config.tie_word_embeddings:
            keys.pop("lm_head.weight", None)
        return keys


def random_tensors(model: SparkForCausalLM, seed: int):
    """Deterministic fan-in-scaled random weights (norm weights near 1), one ``(name, tensor)`` at a time in parameter
    order (works on a meta-device model: a full-size seeded checkpoint is written without holding it in memory)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
            yield name, 1.0 + 0.1 * torch.randn(p.shape, generator=g)
        elif name.endswith("embedding.weight"):
            yield name, torch.randn(p.shape, generator=g)
        else:
            yield name, torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1])


def init_random(model: SparkForCausalLM, seed: int) -> SparkForCausalLM:
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, t in random_tensors(model, seed):
            params[name].copy_(t)
    return model


# ----------------------------------------------------------------------------------------------
# Host-side tables (fp32, never inside a graph)


def rope_table(cfg: SparkConfig, layer_type: str, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [S, rot] in fp32 for NeoX RoPE (computed in fp64, then cast)."""
    rot = cfg.rotary_dim(layer_type)
    inv = 1.0 / (cfg.rope_theta(layer_type) ** (np.arange(0, rot, 2, dtype=np.float64) / rot))
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inv[None, :]
    ang = np.concatenate([ang, ang], axis=-1)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


# ----------------------------------------------------------------------------------------------
# The exported component: one decode step


class SparkDecodeStep(nn.Module):
    """AR-1 decode step over static caches, for layers ``lo..hi-1`` (all layers by default).

    Inputs, by name (``input_names``): ``embeds`` [1,1,H] (gathered on the host) for the first part, else
    ``hidden_{lo}``; ``cos_full``/``sin_full`` [1,1,1,rot_full] and ``cos_sliding``/``sin_sliding`` [1,1,1,rot_sliding]
    (host RoPE tables, fp32); ``mask_full`` [1,1,1,C+1] and ``mask_sliding`` [1,1,1,W] (additive); per layer
    ``k_cache_i``/``v_cache_i`` [1,nkv,C,hd] (full) or [1,nkv,W-1,hd] (sliding ring buffer). Only the tables and
    masks of layer types present are inputs. Outputs: ``logits`` [1,1,V] for the last part (final norm + LM head),
    else ``hidden_{hi}``; then ``k_new_i``/``v_new_i`` [1,nkv,1,hd] per layer. A sliding layer attends to the current
    token and the W-1 before it.
    """

    def __init__(self, lm: SparkForCausalLM, context: int, lo: int = 0, hi: int | None = None):
        super().__init__()
        self.cfg, self.context = lm.config, context
        self.lo, self.hi = lo, lm.config.num_hidden_layers if hi is None else hi
        self.last = self.hi == lm.config.num_hidden_layers
        self.layers = nn.ModuleList(lm.model.layers[self.lo:self.hi])
        self.norm, self.lm_head = (lm.model.norm, lm.lm_head) if self.last else (None, None)
        tags = [t for lt, t in ((FULL, "full"), (SLIDING, "sliding")) if any(l.layer_type == lt for l in self.layers)]
        self.x_name = "embeds" if lo == 0 else f"hidden_{lo}"
        self.input_names = ([self.x_name] + [f"{f}_{t}" for t in tags for f in ("cos", "sin")] +
                            [f"mask_{t}" for t in tags] +
                            [f"{kv}_cache_{i}" for i in range(self.lo, self.hi) for kv in ("k", "v")])
        self.output_names = (["logits" if self.last else f"hidden_{self.hi}"] +
                             [f"{kv}_new_{i}" for i in range(self.lo, self.hi) for kv in ("k", "v")])

    def cache_len(self, layer_type: str) -> int:
        return self.context if layer_type == FULL else self.cfg.sliding_window - 1

    def forward(self, *inputs):
        env = dict(zip(self.input_names, inputs))
        x, new = env[self.x_name], []
        for i, layer in zip(range(self.lo, self.hi), self.layers):
            t = "full" if layer.layer_type == FULL else "sliding"
            x, k, v = layer(x, env[f"cos_{t}"], env[f"sin_{t}"], env[f"mask_{t}"], env[f"k_cache_{i}"], env[f"v_cache_{i}"])
            new += [k, v]
        return (self.lm_head(self.norm(x)) if self.last else x, *new)


@torch.no_grad()
def reference_logits(lm: SparkForCausalLM, tokens: list[int]) -> np.ndarray:
    """Recompute-everything reference: full causal (and sliding) attention over the whole sequence, no cache.

    Returns log-softmax-ready logits [S, V]. Used to check the cached loop's fidelity."""
    cfg = lm.config
    S = len(tokens)
    x = lm.model.embedding(torch.tensor(tokens)[None])
    pos = np.arange(S)
    i, j = np.meshgrid(pos, pos, indexing="ij")
    for layer in lm.model.layers:
        lt = layer.layer_type
        cos, sin = (torch.from_numpy(a)[None, None] for a in rope_table(cfg, lt, pos))
        ok = (j <= i) & ((lt == FULL) | (j > i - cfg.sliding_window))
        mask = torch.from_numpy(np.where(ok, 0.0, -1e9).astype(np.float32))[None, None]
        empty = torch.zeros(1, cfg.num_key_value_heads, 0, cfg.head_dim)
        x, _, _ = layer(x, cos, sin, mask, empty, empty)
    return lm.lm_head(lm.model.norm(x))[0].numpy()


def _spark_family():
    from . import Family

    def decode_step(bundle, context: int, **options):
        from ..components.spark_decode import SparkDecodeComponent
        return SparkDecodeComponent(bundle, context, **options)

    def prefill(bundle, context: int, **options):
        from ..components.spark_prefill import SparkPrefillComponent
        return SparkPrefillComponent(bundle, context, **options)

    return Family(
        name="spark",
        presets=PRESETS,
        config_from_hf=SparkConfig.from_hf,
        config_to_hf=SparkConfig.to_hf,
        build=SparkForCausalLM,
        init_random=init_random,
        random_tensors=random_tensors,
        expected_keys=lambda m: m.expected_keys(),
        components={"decode_step": decode_step, "prefill": prefill},
        meta_init=True,
    )


FAMILY = _spark_family()
