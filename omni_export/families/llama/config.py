"""The llama family's config: Llama / SmolLM / Qwen2 / Qwen3 decoders, read from and written as HF config.json.

Every config.json field is either implemented, listed in ``INFORMATIONAL`` (it does not change the function the
model computes), or refused with a one-line error naming the field and its value.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from ...checkpoints.config_fields import ACCEPTED, canonical
from ...errors import CheckpointError
from ...blocks.layers import FULL, rope_inv_freq

MODEL_TYPES = ("llama", "qwen2", "qwen3")

INFORMATIONAL = frozenset(ACCEPTED)  # the one list of fields that change no function (checkpoints.config_fields)
HF_ROPE_THETA = 10000.0
# transformers' default rope_theta for llama, qwen2 and qwen3 (LlamaConfig, Qwen2Config, Qwen3Config): a config.json
# without one means it, and ``defaults_taken`` records that in the model's provenance
# Qwen2/Qwen3 carry window fields that HF uses only when use_sliding_window is true (refused below).
WINDOW_FIELDS = frozenset({"sliding_window", "max_window_layers"})


def fail(field: str, value, why: str = "is not implemented by the llama family"):
    raise CheckpointError(f"config.json {field}={value!r} {why}")


@dataclass(frozen=True)
class RopeScaling:
    """``rope_scaling`` of config.json: ``linear`` (positions / factor) or ``llama3`` (Llama 3.1's banded scaling)."""
    rope_type: str
    factor: float
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None

    KEYS = {"linear": {"factor"},
            "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}}

    @classmethod
    def from_hf(cls, d, field: str = "rope_scaling") -> "RopeScaling | None":
        """``field``: the config.json field the mapping was written as (``rope_scaling`` or ``rope_parameters``)."""
        if d is None:
            return None
        if not isinstance(d, dict):
            fail(field, d, "must be a mapping or null")
        d = dict(d)
        kinds = {d.pop(k) for k in ("rope_type", "type") if k in d}  # "type": the pre-4.45 spelling
        if len(kinds) > 1:
            fail(f"{field}.rope_type", sorted(map(str, kinds)), "names two different rope types")
        kind = kinds.pop() if kinds else None
        if kind in (None, "default"):
            if d:
                fail(field, {"rope_type": kind, **d}, "has fields the default RoPE does not take")
            return None
        if kind not in cls.KEYS:
            fail(f"{field}.rope_type", kind, "is not implemented (implemented: default, linear, llama3)")
        for k in sorted(set(d) - cls.KEYS[kind]):
            fail(f"{field}.{k}", d[k], f"is not implemented for rope_type {kind}")
        for k in sorted(cls.KEYS[kind] - set(d)):
            fail(f"{field}.{k}", None, f"is required for rope_type {kind}")
        return cls(kind, **{k: positive_field(f"{field}.{k}", v,
                                              float if k != "original_max_position_embeddings" else int)
                            for k, v in d.items()})

    def to_hf(self) -> dict:
        return {"rope_type": self.rope_type, **{k: getattr(self, k) for k in sorted(self.KEYS[self.rope_type])}}

    def apply(self, inv: np.ndarray) -> np.ndarray:
        if self.rope_type == "linear":
            return inv / self.factor
        # llama3 (as transformers' _compute_llama3_parameters): long wavelengths slowed by `factor`, short ones kept,
        # the band between interpolated smoothly
        old = self.original_max_position_embeddings
        low_wl, high_wl = old / self.low_freq_factor, old / self.high_freq_factor
        wl = 2 * math.pi / inv
        scaled = np.where(wl > low_wl, inv / self.factor, inv)
        smooth = (old / wl - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
        smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
        medium = (wl >= high_wl) & (wl <= low_wl)
        return np.where(medium, smoothed, scaled)


def positive_field(field, v, kind=int):
    """``v`` as ``kind`` if it is a positive integer (``kind=int``) or a positive finite number (``kind=float``), else
    one ``fail`` line naming ``field``."""
    if kind is int and (type(v) is not int or v <= 0):
        fail(field, v, "must be a positive integer")
    if kind is float and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0):
        fail(field, v, "must be a positive number")
    return kind(v)


@dataclass(frozen=True)
class LlamaConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    head_dim: int = 0                    # 0: hidden_size // num_attention_heads
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = HF_ROPE_THETA
    rope_scaling: RopeScaling | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False         # llama/qwen3: bias on q, k, v and o projections
    model_type: str = "llama"            # qwen2: q/k/v biases always (none on o); qwen3: per-head q/k RMSNorm

    def __post_init__(self):
        if self.model_type not in MODEL_TYPES:
            fail("model_type", self.model_type, f"is not a llama-family model (accepted: {', '.join(MODEL_TYPES)})")
        for f in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "vocab_size", "max_position_embeddings"):
            positive_field(f, getattr(self, f))
        if not self.head_dim:
            if self.hidden_size % self.num_attention_heads:
                fail("num_attention_heads", self.num_attention_heads,
                     f"does not divide hidden_size {self.hidden_size} (and no head_dim is given)")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        positive_field("head_dim", self.head_dim)
        if self.head_dim % 2:
            fail("head_dim", self.head_dim, "must be even (rotate-half RoPE)")
        if self.num_attention_heads % self.num_key_value_heads:
            fail("num_key_value_heads", self.num_key_value_heads,
                 f"does not divide num_attention_heads {self.num_attention_heads}")
        positive_field("rms_norm_eps", self.rms_norm_eps, float)
        positive_field("rope_theta", self.rope_theta, float)

    # -- the DecoderLM protocol ---------------------------------------------------------------------
    @property
    def layer_types(self) -> tuple[str, ...]:
        return (FULL,) * self.num_hidden_layers

    @property
    def sliding_window(self) -> int:
        """No sliding layers: the window is the whole position range (never limits a cache or a prefill chunk)."""
        return self.max_position_embeddings

    def rotary_dim(self, layer_type: str = FULL) -> int:
        return self.head_dim

    def inv_freq(self, layer_type: str = FULL) -> np.ndarray:
        """RoPE inverse frequencies (float64, head_dim // 2), rope scaling applied."""
        inv = rope_inv_freq(self.rope_theta, self.head_dim)
        return inv if self.rope_scaling is None else self.rope_scaling.apply(inv)

    # -- what the layers build -----------------------------------------------------------------------
    @property
    def qkv_bias(self) -> bool:
        return self.attention_bias or self.model_type == "qwen2"

    @property
    def o_bias(self) -> bool:
        return self.attention_bias and self.model_type != "qwen2"

    @property
    def qk_norm(self) -> bool:
        return self.model_type == "qwen3"

    # -- config.json ---------------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, cfg: dict) -> "LlamaConfig":
        """From a checkpoint's config.json; anything the family does not implement is a one-line error."""
        d = dict(cfg)
        mt = d.pop("model_type", "llama")
        if mt not in MODEL_TYPES:
            fail("model_type", mt, f"is not a llama-family model (accepted: {', '.join(MODEL_TYPES)})")
        act = d.pop("hidden_act", "silu")
        if canonical("hidden_act", act) != "silu":
            fail("hidden_act", act, "is not implemented (the llama family's gated MLP is SiLU)")
        for flag in ("mlp_bias", "use_sliding_window", "rope_interleaved"):
            v = d.pop(flag, False)
            if v is not False and v is not None:
                fail(flag, v)
        if mt == "llama" and d.pop("sliding_window", None) is not None:
            fail("sliding_window", cfg["sliding_window"], "is not implemented (llama layers attend to every position)")
        if mt == "qwen2" and "attention_bias" in d:  # Qwen2's q/k/v biases are fixed by the architecture
            fail("attention_bias", d["attention_bias"], "is not a qwen2 field (its q/k/v biases are always present)")
        lt = d.pop("layer_types", None)
        if lt is not None and (not isinstance(lt, list) or any(t != FULL for t in lt)):
            fail("layer_types", lt, f"is not implemented (every layer must be {FULL!r})")
        if lt is not None and len(lt) != d.get("num_hidden_layers"):
            fail("layer_types", f"{len(lt)} entries", f"does not match num_hidden_layers {d.get('num_hidden_layers')!r}")
        prf = d.pop("partial_rotary_factor", 1.0)
        if prf != 1.0:
            fail("partial_rotary_factor", prf)
        scaling = RopeScaling.from_hf(d.pop("rope_scaling", None), "rope_scaling")
        rp = d.pop("rope_parameters", None)  # transformers >= 5 keeps theta and scaling together
        if rp is not None:
            if not isinstance(rp, dict):
                fail("rope_parameters", rp, "must be a mapping")
            rp = dict(rp)
            if "rope_theta" in rp:
                if d.get("rope_theta", rp["rope_theta"]) != rp["rope_theta"]:
                    fail("rope_parameters.rope_theta", rp["rope_theta"], f"differs from rope_theta {d['rope_theta']!r}")
                d["rope_theta"] = rp.pop("rope_theta")
            in_params = RopeScaling.from_hf(rp, "rope_parameters")
            if "rope_scaling" in cfg and cfg["rope_scaling"] is not None and scaling != in_params:
                fail("rope_scaling", cfg["rope_scaling"], f"differs from the scaling of rope_parameters {cfg['rope_parameters']!r}")
            scaling = in_params
        kw = {"model_type": mt}
        names = {f.name for f in dataclasses.fields(cls)}
        for k, v in d.items():
            if k in names:
                kw[k] = v
            elif k not in INFORMATIONAL and not (mt != "llama" and k in WINDOW_FIELDS):
                fail(k, v)
        kw["rope_scaling"] = scaling
        for k in ("tie_word_embeddings", "attention_bias"):
            if not isinstance(kw.get(k, False), bool):
                fail(k, kw[k], "must be true or false")
        if kw.get("num_key_value_heads") is None:  # HF's default: no grouping
            kw["num_key_value_heads"] = kw.get("num_attention_heads")
        if kw.get("head_dim") is None:  # absent or null: hidden_size // num_attention_heads
            kw.pop("head_dim", None)
        else:
            positive_field("head_dim", kw["head_dim"])
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.default is dataclasses.MISSING and kw.get(f.name) is None]
        if missing:
            fail(missing[0], None, "is required")
        for k in ("rms_norm_eps", "rope_theta"):
            if k in kw:
                kw[k] = positive_field(k, kw[k], float)
        return cls(**kw)

    @staticmethod
    def defaults_taken(cfg: dict) -> tuple[str, ...]:
        """What ``from_hf`` took from transformers' defaults because config.json does not say it (a note each)."""
        rp = cfg.get("rope_parameters")
        if "rope_theta" in cfg or (isinstance(rp, dict) and "rope_theta" in rp):
            return ()
        return (f"config.json gives no rope_theta: transformers' default {HF_ROPE_THETA:g} for "
                f"{cfg.get('model_type', 'llama')} applies",)

    def to_hf(self) -> dict:
        d = dataclasses.asdict(self)
        d["rope_scaling"] = None if self.rope_scaling is None else self.rope_scaling.to_hf()
        d["hidden_act"] = "silu"
        d["layer_types"] = list(self.layer_types)
        if self.model_type == "qwen2":
            d.pop("attention_bias")
        return d


PRESETS = {
    # Seeded test model: 4 layers, GQA 4/2, vocab 4096 (the byte tokenizer fits), tied head like SmolLM2.
    "tiny": LlamaConfig(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=4096, max_position_embeddings=512, rms_norm_eps=1e-5,
                        rope_theta=10000.0, tie_word_embeddings=True),
    # SmolLM2-135M-Instruct's shape (its config.json), seeded: for timing and memory runs without the checkpoint.
    "smollm2-135m": LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                                num_key_value_heads=3, vocab_size=49152, head_dim=64, max_position_embeddings=8192,
                                rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True),
}
