"""The gemma3 family's config: Gemma 3 text decoders (``Gemma3ForCausalLM``, ``model_type`` gemma3_text), read from
and written as HF config.json.

Every config.json field is either implemented, listed in ``INFORMATIONAL`` (it does not change the function the
model computes), or refused with a one-line error naming the field and its value. A multimodal Gemma 3 checkpoint
(``model_type`` gemma3 with a vision tower), Gemma 2 and Gemma 3n are refused by name.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from ...errors import CheckpointError
from ...blocks.layers import FULL, SLIDING, rope_inv_freq
from ..llama.config import RopeScaling, positive_field

MODEL_TYPE = "gemma3_text"
ACTIVATION = "gelu_pytorch_tanh"  # GeGLU with the tanh approximation of GELU
PATTERN = 6  # Gemma 3: every sixth layer attends fully, the five before it slide (5 sliding : 1 full)
OTHER_GEMMAS = {"gemma": "Gemma 1", "gemma2": "Gemma 2", "gemma3n": "Gemma 3n", "gemma3n_text": "Gemma 3n"}

INFORMATIONAL = frozenset({
    # provenance and packaging
    "architectures", "torch_dtype", "dtype", "transformers_version", "_name_or_path", "model_name",
    # token ids the tokenizer / generation config own
    "bos_token_id", "eos_token_id", "pad_token_id",
    # training-only or runtime switches: no effect on an inference forward pass
    "initializer_range", "use_cache", "attention_dropout", "cache_implementation",
})


def fail(field: str, value, why: str = "is not implemented by the gemma3 family"):
    raise CheckpointError(f"config.json {field}={value!r} {why}")


def default_layer_types(n: int, pattern: int = PATTERN) -> tuple[str, ...]:
    """Gemma 3's layout: layer i is full attention when (i + 1) is a multiple of ``pattern``, else sliding."""
    return tuple(FULL if (i + 1) % pattern == 0 else SLIDING for i in range(n))


@dataclass(frozen=True)
class Gemma3Config:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    head_dim: int = 256
    query_pre_attn_scalar: float = 256.0   # queries scaled by query_pre_attn_scalar ** -0.5
    sliding_window: int = 4096              # a sliding layer sees its token and the sliding_window - 1 before it
    layer_types: tuple[str, ...] = ()       # (): Gemma 3's 5 sliding : 1 full layout
    max_position_embeddings: int = 32768
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0         # full-attention layers
    rope_local_base_freq: float = 10_000.0  # sliding layers (never scaled)
    rope_scaling: RopeScaling | None = None  # full-attention layers only; linear
    tie_word_embeddings: bool = True
    model_type: str = MODEL_TYPE

    def __post_init__(self):
        if self.model_type != MODEL_TYPE:
            fail("model_type", self.model_type, f"is not a gemma3 text model (accepted: {MODEL_TYPE})")
        for f in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "vocab_size", "head_dim", "sliding_window", "max_position_embeddings"):
            positive_field(f, getattr(self, f))
        if self.head_dim % 2:
            fail("head_dim", self.head_dim, "must be even (rotate-half RoPE)")
        if self.num_attention_heads % self.num_key_value_heads:
            fail("num_key_value_heads", self.num_key_value_heads,
                 f"does not divide num_attention_heads {self.num_attention_heads}")
        for f in ("query_pre_attn_scalar", "rms_norm_eps", "rope_theta", "rope_local_base_freq"):
            object.__setattr__(self, f, positive_field(f, getattr(self, f), float))
        if self.rope_scaling is not None and self.rope_scaling.rope_type != "linear":
            fail("rope_scaling.rope_type", self.rope_scaling.rope_type, "is not implemented (gemma3: linear)")
        lt = tuple(self.layer_types) or default_layer_types(self.num_hidden_layers)
        if len(lt) != self.num_hidden_layers or any(t not in (FULL, SLIDING) for t in lt):
            fail("layer_types", list(lt), f"must be {self.num_hidden_layers} entries of {FULL!r} or {SLIDING!r}")
        object.__setattr__(self, "layer_types", lt)

    # -- the DecoderLM protocol ---------------------------------------------------------------------
    def rotary_dim(self, layer_type: str = FULL) -> int:
        return self.head_dim

    def inv_freq(self, layer_type: str = FULL) -> np.ndarray:
        """RoPE inverse frequencies (float64): base rope_theta with rope_scaling on full layers, the local base
        unscaled on sliding layers (as transformers' Gemma3 ``rotary_emb`` / ``rotary_emb_local``)."""
        if layer_type == SLIDING:
            return rope_inv_freq(self.rope_local_base_freq, self.head_dim)
        inv = rope_inv_freq(self.rope_theta, self.head_dim)
        return inv if self.rope_scaling is None else self.rope_scaling.apply(inv)

    @property
    def embed_scale(self) -> float:
        """The embedding multiplier sqrt(hidden_size), as the fp32 value transformers applies in an fp32 model."""
        return float(np.float32(math.sqrt(self.hidden_size)))

    @property
    def query_scale(self) -> float:
        """Extra query multiplier on top of the shared attention's 1/sqrt(head_dim): sqrt(head_dim / qpas)."""
        return math.sqrt(self.head_dim / self.query_pre_attn_scalar)

    # -- config.json ---------------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, cfg: dict) -> "Gemma3Config":
        """From a checkpoint's config.json; anything the family does not implement is a one-line error."""
        d = dict(cfg)
        mt = d.pop("model_type", None)
        if mt == "gemma3" or "vision_config" in d or "text_config" in d:
            fail("model_type", mt, "is a multimodal Gemma 3 checkpoint (vision tower): not implemented; the gemma3 "
                 "family takes text-only Gemma3ForCausalLM (gemma3_text) checkpoints")
        if mt in OTHER_GEMMAS:
            fail("model_type", mt, f"is {OTHER_GEMMAS[mt]}, not implemented by the gemma3 family (gemma3_text only)")
        if mt != MODEL_TYPE:
            fail("model_type", mt, f"is not a gemma3 text model (accepted: {MODEL_TYPE})")
        acts = {d.pop(k) for k in ("hidden_activation", "hidden_act") if k in d}
        if acts != {ACTIVATION}:
            fail("hidden_activation", sorted(map(str, acts)) or None, f"is not implemented (gemma3: {ACTIVATION})")
        for k in ("attn_logit_softcapping", "final_logit_softcapping"):
            if d.pop(k, None) is not None:
                fail(k, cfg[k], "is not implemented (Gemma 3 has no soft-capping)")
        for flag in ("attention_bias", "use_bidirectional_attention"):
            if d.pop(flag, False) not in (False, None):
                fail(flag, cfg[flag])
        patterns = {d.pop(k) for k in ("sliding_window_pattern", "_sliding_window_pattern") if k in d}
        lt = d.pop("layer_types", None)
        n = d.get("num_hidden_layers")
        if lt is None:
            if len(patterns) > 1:
                fail("sliding_window_pattern", sorted(patterns), "names two different patterns")
            pat = patterns.pop() if patterns else PATTERN
            if type(pat) is not int or pat < 1 or type(n) is not int:
                fail("sliding_window_pattern", pat, "must be a positive integer (with num_hidden_layers)")
            lt = default_layer_types(n, pat)
        elif not isinstance(lt, list):
            fail("layer_types", lt, "must be a list")
        else:
            for p in patterns:  # informational when layer_types is given, but it must agree with it
                if type(p) is not int or p < 1 or tuple(lt) != default_layer_types(len(lt), p):
                    fail("sliding_window_pattern", p, "disagrees with layer_types")
        rp = d.pop("rope_parameters", None)  # transformers >= 5: per layer type
        if rp is not None:
            if not isinstance(rp, dict) or set(rp) - {FULL, SLIDING} or "rope_scaling" in d:
                fail("rope_parameters", rp, f"must map {FULL!r}/{SLIDING!r} to rope parameters (without rope_scaling)")
            full, local = dict(rp.get(FULL) or {}), dict(rp.get(SLIDING) or {})
            if "rope_theta" in full:
                d["rope_theta"] = full.pop("rope_theta")
            if "rope_theta" in local:
                d["rope_local_base_freq"] = local.pop("rope_theta")
            if local.get("rope_type", "default") != "default" or set(local) - {"rope_type"}:
                fail(f"rope_parameters.{SLIDING}", rp[SLIDING], "is not implemented (sliding layers: default RoPE)")
            d["rope_scaling"] = full or None
        kw = {"model_type": mt, "layer_types": tuple(lt)}
        names = {f.name for f in dataclasses.fields(cls)}
        for k, v in d.items():
            if k in names:
                kw[k] = v
            elif k not in INFORMATIONAL:
                fail(k, v)
        kw["rope_scaling"] = RopeScaling.from_hf(kw.get("rope_scaling"))
        if not isinstance(kw.get("tie_word_embeddings", True), bool):
            fail("tie_word_embeddings", kw["tie_word_embeddings"], "must be true or false")
        if kw.get("num_key_value_heads") is None:
            kw["num_key_value_heads"] = kw.get("num_attention_heads")
        for k in ("head_dim", "query_pre_attn_scalar"):
            if k in kw and kw[k] is None:
                fail(k, None, "must be a number")
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.default is dataclasses.MISSING and kw.get(f.name) is None]
        if missing:
            fail(missing[0], None, "is required")
        return cls(**kw)

    def to_hf(self) -> dict:
        d = dataclasses.asdict(self)
        d["rope_scaling"] = None if self.rope_scaling is None else self.rope_scaling.to_hf()
        d["layer_types"] = list(self.layer_types)
        d["hidden_activation"] = ACTIVATION
        d["architectures"] = ["Gemma3ForCausalLM"]
        return d


PRESETS = {
    # Seeded test model: 6 layers (5 sliding : 1 full), window 16 (tests cross it), GQA 4/1 as the 270M, byte vocab.
    "tiny": Gemma3Config(hidden_size=128, intermediate_size=384, num_hidden_layers=6, num_attention_heads=4,
                         num_key_value_heads=1, vocab_size=4096, head_dim=64, query_pre_attn_scalar=64,
                         sliding_window=16, max_position_embeddings=512),
    # google/gemma-3-270m's shape (its config.json), seeded: for timing and memory runs without the checkpoint.
    "gemma3-270m": Gemma3Config(hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
                                num_key_value_heads=1, vocab_size=262144, head_dim=256, query_pre_attn_scalar=256,
                                sliding_window=512, max_position_embeddings=32768),
}
