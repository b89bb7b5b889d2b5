"""MiniCPM-o 4.5 speech output configuration: the TTS head (a plain Llama), the flow (upsampling Conformer encoder +
DiT estimator) and HiFT, with the presets ``tiny`` and ``4.5`` (the real sizes of the released ``tts`` head,
``flow.yaml`` and HiFT; docs/minicpmo.md). Streaming constants (25 + 3 look-ahead tokens per chunk, 10 Euler
steps, CFG rate 0.7, history of prompt + 100 mel frames) are upstream's (``stepaudio2.token2wav``)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..llama.config import LlamaConfig

AUDIO_BOS, TEXT_EOS = 151687, 151692   # emb_text rows the prefill ends with (the real text vocabulary)
SILENCE_TOKEN = 4218                   # three of these start each reply (flow input)


@dataclass(frozen=True)
class EncoderConfig:
    """``UpsampleConformerEncoderV2`` + the flow's token embedding, speaker affine and ``encoder_proj``."""
    vocab_size: int = 6561
    hidden: int = 512
    heads: int = 8
    linear_units: int = 2048
    num_blocks: int = 6
    num_up_blocks: int = 4
    pre_lookahead_len: int = 3
    up_stride: int = 2
    spk_embed_dim: int = 192
    mel: int = 80
    pe_rows: int = 5000                # EspnetRelPositionalEncoding max_len


@dataclass(frozen=True)
class DiTConfig:
    in_channels: int = 320             # concat[x_t, mu, spk, cond], 80 each
    out_channels: int = 80
    hidden: int = 512
    depth: int = 16
    heads: int = 8
    head_dim: int = 64
    mlp_ratio: float = 4.0
    freq_dim: int = 256                # sinusoidal timestep embedding size


@dataclass(frozen=True)
class HiFTConfig:
    mel: int = 80
    base_channels: int = 512
    nb_harmonics: int = 8
    sampling_rate: int = 24000
    nsf_alpha: float = 0.1
    nsf_sigma: float = 0.003
    nsf_voiced_threshold: float = 10.0
    upsample_rates: tuple[int, ...] = (8, 5, 3)
    upsample_kernel_sizes: tuple[int, ...] = (16, 11, 7)
    n_fft: int = 16
    hop_len: int = 4
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilations: tuple[int, ...] = (1, 3, 5)
    source_resblock_kernel_sizes: tuple[int, ...] = (7, 7, 11)
    lrelu_slope: float = 0.1
    audio_limit: float = 0.99
    f0_channels: int = 512

    @property
    def samples_per_frame(self) -> int:
        n = self.hop_len
        for r in self.upsample_rates:
            n *= r
        return n


@dataclass(frozen=True)
class MiniCPMOConfig:
    tts: LlamaConfig
    encoder: EncoderConfig
    dit: DiTConfig
    hift: HiFTConfig
    text_vocab_size: int = 152064      # emb_text rows
    llm_hidden: int = 4096             # projector_semantic input (the Qwen3-8B hidden state)
    num_audio_tokens: int = 6562       # 6561 FSQ codes + EOS
    chunk_tokens: int = 25
    n_timesteps: int = 10
    cfg_rate: float = 0.7
    history_frames: int = 100          # upstream's CONFORMER_HISTORY_FRAMES / estimator trim

    @property
    def chunk_frames(self) -> int:
        return self.chunk_tokens * self.encoder.up_stride

    @property
    def eos_id(self) -> int:
        return self.num_audio_tokens - 1

    def to_hf(self) -> dict:
        d = {k: dataclasses.asdict(getattr(self, k)) for k in ("encoder", "dit", "hift")}
        d["tts"] = self.tts.to_hf()
        return {"model_type": "minicpmo_tts", **d, **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                                                      if f.name not in ("tts", "encoder", "dit", "hift")}}

    @classmethod
    def from_hf(cls, d: dict) -> "MiniCPMOConfig":
        def sub(kind, key):
            v = dict(d.get(key, {}))
            for k, x in v.items():
                if isinstance(x, list):
                    v[k] = tuple(x)
            return kind(**v)

        rest = {k: v for k, v in d.items() if k not in ("model_type", "tts", "encoder", "dit", "hift")}
        return cls(LlamaConfig.from_hf(d["tts"]), sub(EncoderConfig, "encoder"), sub(DiTConfig, "dit"),
                   sub(HiFTConfig, "hift"), **rest)


def _tts(hidden, inter, layers, heads, vocab) -> LlamaConfig:
    # emb_code/head_code are the model's; LlamaModel's own embed_tokens (32000 rows, unused at inference) is kept
    # at ``vocab`` rows so the official key layout loads
    return LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
                       num_key_value_heads=heads, vocab_size=vocab, max_position_embeddings=4096, rms_norm_eps=1e-6,
                       rope_theta=10000.0)


PRESETS = {
    # Every part present at small width; the real chunking (25 + 3 tokens -> 50 mel frames), the real mel size,
    # HiFT's real upsampling (480 samples per frame) and FFT (16/4), the real audio vocabulary (6562).
    "tiny": MiniCPMOConfig(
        tts=_tts(64, 128, 2, 4, 256),
        encoder=EncoderConfig(hidden=64, heads=2, linear_units=128, num_blocks=2, num_up_blocks=2, spk_embed_dim=16,
                              pe_rows=1000),
        dit=DiTConfig(hidden=64, depth=2, heads=2, head_dim=32, freq_dim=32),
        hift=HiFTConfig(base_channels=32, f0_channels=32),
        text_vocab_size=512, llm_hidden=64),
    "4.5": MiniCPMOConfig(tts=_tts(768, 3072, 20, 12, 32000), encoder=EncoderConfig(), dit=DiTConfig(),
                          hift=HiFTConfig()),
}
