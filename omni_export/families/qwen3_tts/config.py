"""Qwen3-TTS 12 Hz configuration: the talker and code-predictor decoder stacks, the Code2Wav decoder, and the presets.

Field names follow the official ``config.json`` (and the tokenizer's ``speech_tokenizer/config.json``)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ...errors import CheckpointError
from ...blocks.layers import rope_inv_freq

# codec ids of the talker vocabulary (rows 0..2047 are codebook-0 codes)
CODEC_PAD, CODEC_BOS, CODEC_EOS = 2148, 2149, 2150
TEXT_PAD, TEXT_BOS = 0, 1   # byte-tokenizer stand-ins for tts_pad / tts_bos


@dataclass(frozen=True)
class LMConfig:
    """A Qwen3 decoder stack (talker or code predictor)."""
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768

    def inv_freq(self) -> np.ndarray:
        return rope_inv_freq(self.rope_theta, self.head_dim)


@dataclass(frozen=True)
class DecoderConfig:
    """The 12 Hz tokenizer decoder (Code2Wav)."""
    codebook_size: int = 2048
    codebook_dim: int = 512
    latent_dim: int = 1024
    hidden_size: int = 512
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int = 64
    intermediate_size: int = 1024
    num_hidden_layers: int = 8
    sliding_window: int = 72
    rope_theta: float = 10_000.0
    rms_norm_eps: float = 1e-5
    layer_scale_initial_scale: float = 0.01
    num_quantizers: int = 16
    decoder_dim: int = 1536
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)
    sample_rate: int = 24000

    def inv_freq(self) -> np.ndarray:
        return rope_inv_freq(self.rope_theta, self.head_dim)

    @property
    def samples_per_frame(self) -> int:
        return int(np.prod(self.upsample_rates + self.upsampling_ratios))


@dataclass(frozen=True)
class Qwen3TTSConfig:
    talker: LMConfig
    predictor: LMConfig
    decoder: DecoderConfig
    text_vocab_size: int = 151936
    text_hidden_size: int = 2048
    num_code_groups: int = 16

    @classmethod
    def from_hf(cls, cfg: dict, tokenizer_cfg: dict) -> "Qwen3TTSConfig":
        """From the model's config.json and the tokenizer's (speech_tokenizer/config.json)."""
        t = cfg.get("talker_config", cfg)
        p = t["code_predictor_config"]
        d = tokenizer_cfg.get("decoder_config", tokenizer_cfg)
        for where, c in (("config.json talker_config", t), ("config.json talker_config.code_predictor_config", p),
                         ("speech_tokenizer/config.json decoder_config", d)):
            if isinstance(c, dict) and "rope_theta" not in c:
                # the qwen-tts config classes' defaults are not the released models' values: no default is taken
                raise CheckpointError(f"{where} has no rope_theta (required: the qwen-tts config "
                                      f"defaults differ from the released models')")

        def lm(c):
            kw = {f.name: c[f.name] for f in dataclasses.fields(LMConfig) if f.name in c}
            kw.setdefault("head_dim", c["hidden_size"] // c["num_attention_heads"])
            return LMConfig(**kw)

        dkw = {f.name: d[f.name] for f in dataclasses.fields(DecoderConfig) if f.name in d}
        for k in ("upsample_rates", "upsampling_ratios"):
            if k in dkw:
                dkw[k] = tuple(dkw[k])
        dkw.setdefault("head_dim", d.get("hidden_size", 512) // d.get("num_attention_heads", 16))
        if "output_sample_rate" in tokenizer_cfg:
            dkw["sample_rate"] = tokenizer_cfg["output_sample_rate"]
        return cls(lm(t), lm(p), DecoderConfig(**dkw), text_vocab_size=t.get("text_vocab_size", 151936),
                   text_hidden_size=t.get("text_hidden_size", 2048), num_code_groups=t.get("num_code_groups", 16))

    def to_hf(self) -> dict:
        t = dataclasses.asdict(self.talker) | {"text_vocab_size": self.text_vocab_size,
                                               "text_hidden_size": self.text_hidden_size,
                                               "num_code_groups": self.num_code_groups}
        t["code_predictor_config"] = dataclasses.asdict(self.predictor) | {"num_code_groups": self.num_code_groups}
        d = dataclasses.asdict(self.decoder)
        d["upsample_rates"], d["upsampling_ratios"] = list(d["upsample_rates"]), list(d["upsampling_ratios"])
        return {"model_type": "qwen3_tts", "talker_config": t, "speech_tokenizer": {"decoder_config": d}}


PRESETS = {
    # Embedded default: every part present at small width; the decoder keeps the real window (72), the real
    # upsampling (1920 samples per 80 ms frame at 24 kHz) and a predictor narrower than the talker
    # (so small_to_mtp_projection is exercised).
    "tiny": Qwen3TTSConfig(
        talker=LMConfig(128, 384, 2, 4, 2, 32, 3072),
        predictor=LMConfig(64, 192, 2, 4, 2, 16, 2048),
        decoder=DecoderConfig(codebook_dim=64, latent_dim=64, hidden_size=32, num_attention_heads=4,
                              num_key_value_heads=4, head_dim=16, intermediate_size=64, num_hidden_layers=2,
                              decoder_dim=64),
        text_vocab_size=512, text_hidden_size=128),
    "0.6B": Qwen3TTSConfig(talker=LMConfig(1024, 3072, 28, 16, 8, 128, 3072),
                           predictor=LMConfig(1024, 3072, 5, 16, 8, 128, 2048), decoder=DecoderConfig()),
    "1.7B": Qwen3TTSConfig(talker=LMConfig(2048, 6144, 28, 16, 8, 128, 3072),
                           predictor=LMConfig(1024, 3072, 5, 16, 8, 128, 2048), decoder=DecoderConfig()),
}
