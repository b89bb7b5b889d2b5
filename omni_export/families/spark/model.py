"""Spark-X2.5 (model_type ``spark2_5``): an export-friendly fp32 definition.

Hybrid 3:1 sliding/full attention, a head-wise sigmoid output gate, per-layer-type RoPE
(theta and partial rotary factor), exact-GELU gated MLP and a fused q_k_v projection.
Parameter names follow the Hugging Face checkpoint layout, so a checkpoint's state dict
loads without renaming.

It follows the DecoderLM protocol (``components.decoder_lm``): the family's decode step and prefill are the
shared ones, with static shapes, the token's embedding gathered on the host, RoPE tables and additive masks
prepared on the host in fp32, caches passed in, and only the new K/V rows passed out.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ...checkpoints.config_fields import ACCEPTED, canonical
from ...errors import CheckpointError
from ...blocks.layers import FULL, SLIDING, DecoderLayer, GatedMLP, RMSNorm, grouped_attention, rope_inv_freq, rotate


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

    def inv_freq(self, layer_type: str) -> np.ndarray:
        return rope_inv_freq(self.rope_theta(layer_type), self.rotary_dim(layer_type))

    @classmethod
    def from_hf(cls, cfg: dict) -> "SparkConfig":
        """Build from a checkpoint's config.json (HF field names). Every field is implemented, informational
        (``INFORMATIONAL``: no effect on the function computed) or a one-line error naming it; the sizes are required
        (a missing one would silently take the 1.7B default)."""
        if not isinstance(cfg, dict):
            raise CheckpointError(f"config.json must be a JSON object, not {type(cfg).__name__}")
        if cfg.get("model_type") not in (None, "spark2_5"):
            raise CheckpointError(f"config.json model_type={cfg.get('model_type')!r} is not 'spark2_5'")
        for k, v in cfg.items():
            if k in FIXED and canonical(k, v) != FIXED[k]:
                raise CheckpointError(f"config.json {k}={v!r} is not implemented by the spark family (only {FIXED[k]!r})")
            if k not in FIXED and k not in INFORMATIONAL and k not in _FIELDS and k not in ("rope_parameters",):
                raise CheckpointError(f"config.json {k}={v!r} is not implemented by the spark family")
        for k in REQUIRED:
            v = cfg.get(k)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise CheckpointError(f"config.json {k}={v!r} must be a positive integer" if k in cfg else
                                      f"config.json has no {k} (required)")
        kw = {f: cfg[f] for f in _FIELDS if f in cfg and f != "layer_types"}
        for k in ("rms_norm_eps",):
            if k in kw and (isinstance(kw[k], bool) or not isinstance(kw[k], (int, float))
                            or not math.isfinite(kw[k]) or kw[k] <= 0):
                raise CheckpointError(f"config.json {k}={kw[k]!r} must be a positive number")
        if "layer_types" in cfg:
            lt = cfg["layer_types"]
            if not isinstance(lt, list) or any(t not in (FULL, SLIDING) for t in lt):
                raise CheckpointError(f"config.json layer_types={lt!r} must list {FULL!r} / {SLIDING!r}")
            if len(lt) != cfg["num_hidden_layers"]:
                raise CheckpointError(f"config.json layer_types has {len(lt)} entries but num_hidden_layers is "
                                      f"{cfg['num_hidden_layers']}")
            kw["layer_types"] = tuple(lt)
        rp = cfg.get("rope_parameters")
        if rp is not None:  # absent: the config class's defaults (``defaults_taken`` says so in the provenance)
            if not isinstance(rp, dict) or set(rp) - {FULL, SLIDING}:
                raise CheckpointError(f"config.json rope_parameters={rp!r} must map {FULL!r} / {SLIDING!r}")
            n = cfg["num_hidden_layers"]
            used = set(kw.get("layer_types") or (FULL if (i + 1) % 4 == 0 else SLIDING for i in range(n)))
            for lt, suffix in ((FULL, "full"), (SLIDING, "sliding")):
                if lt not in rp:
                    if lt in used:
                        raise CheckpointError(f"config.json rope_parameters has no {lt} entry (the model has "
                                              f"{lt} layers)")
                    continue
                if not isinstance(rp[lt], dict):
                    raise CheckpointError(f"config.json rope_parameters.{lt}={rp[lt]!r} must be a mapping")
                extra = set(rp[lt]) - {"rope_theta", "partial_rotary_factor", "rope_type"}
                if extra or rp[lt].get("rope_type", "default") != "default":
                    raise CheckpointError(f"config.json rope_parameters.{lt}={rp[lt]!r}: only rope_theta and "
                                          "partial_rotary_factor (default rope) are implemented")
                for k in ("rope_theta", "partial_rotary_factor"):
                    v = rp[lt].get(k)
                    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                        raise CheckpointError(f"config.json rope_parameters.{lt}.{k}={v!r} must be a positive number"
                                              if k in rp[lt] else f"config.json rope_parameters.{lt} has no {k}")
                    kw[f"{k}_{suffix}"] = float(v)
        try:
            return cls(**kw)
        except (TypeError, ValueError) as err:
            raise CheckpointError(f"config.json: {err}") from None

    @classmethod
    def defaults_taken(cls, cfg: dict) -> tuple[str, ...]:
        """What ``from_hf`` took from the config class's defaults because config.json does not say it (a note each)."""
        if isinstance(cfg, dict) and cfg.get("rope_parameters") is None:
            return (f"config.json has no rope_parameters: the spark2_5 config class's defaults apply ({FULL}: "
                    f"rope_theta {cls.rope_theta_full:g}, partial_rotary_factor {cls.partial_rotary_factor_full}; "
                    f"{SLIDING}: rope_theta {cls.rope_theta_sliding:g}, partial_rotary_factor "
                    f"{cls.partial_rotary_factor_sliding})",)
        return ()

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


_FIELDS = frozenset({"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "sliding_window", "vocab_size", "rms_norm_eps",
                     "max_position_embeddings", "tie_word_embeddings", "layer_types"})
REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "sliding_window", "vocab_size")
FIXED = {"headwise_attn_output_gate": True, "hidden_act": "gelu", "attention_bias": False, "model_type": "spark2_5"}
INFORMATIONAL = frozenset(ACCEPTED)  # the one list of fields that change no function (checkpoints.config_fields)


PRESETS = {
    # Embedded default: 4 layers (3 sliding + 1 full), a window of 16 that the parity run crosses.
    "tiny": SparkConfig(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=64, sliding_window=16, vocab_size=4096,
                        max_position_embeddings=512),
    "full": SparkConfig(),  # the 1.7B-class defaults of the upstream config class
}


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


def spark_layer(cfg: SparkConfig, layer_type: str) -> DecoderLayer:
    return DecoderLayer(cfg.hidden_size, cfg.rms_norm_eps, Attention(cfg, layer_type),
                        GatedMLP(cfg.hidden_size, cfg.intermediate_size, F.gelu), layer_type)  # exact (erf) GELU


class SparkBackbone(nn.Module):
    def __init__(self, cfg: SparkConfig):
        super().__init__()
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(spark_layer(cfg, t) for t in cfg.layer_types)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class SparkForCausalLM(nn.Module):
    def __init__(self, cfg: SparkConfig):
        super().__init__()
        self.config = cfg
        self.model = SparkBackbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embedding.weight

    def input_embedding(self) -> nn.Embedding:
        return self.model.embedding

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
            yield name, torch.randn(p.shape, generator=g).div_(math.sqrt(p.shape[1]))  # in place: the same values


def init_random(model: SparkForCausalLM, seed: int) -> SparkForCausalLM:
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, t in random_tensors(model, seed):
            params[name].copy_(t)
    return model
