"""Qwen3-TTS 12 Hz (talker, code predictor, Code2Wav decoder): an export-friendly fp32 definition.

Parameter names follow the official checkpoints, so their state dicts load without renaming:
``talker.*`` from the model's ``model.safetensors`` and ``speech_tokenizer.decoder.*`` from the tokenizer's
(``speech_tokenizer/model.safetensors`` keys ``decoder.*``). A checkpoint directory is the released model
directory with the 12 Hz tokenizer in its ``speech_tokenizer/`` subdirectory (how the released repos ship).

Graphs never see a Python-int position: RoPE cos/sin tables and additive masks are computed on the host in fp32
and passed in; caches come in and only new K/V rows go out. The Code2Wav decoder has two forms: ``forward``
(the whole code sequence at once, the reference) and ``Code2WavChunk`` (one chunk plus the carried state: every
causal conv's input tail and every layer's last ``sliding_window - 1`` K/V rows), which reproduces the full
decode exactly.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .spark import MASK_VALUE, RMSNorm, grouped_attention, rotate

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


# ----------------------------------------------------------------------------------------------
# Talker and code predictor: Qwen3 layers (q/k RMSNorm per head, GQA, SwiGLU)


class Attention(nn.Module):
    def __init__(self, hidden: int, nh: int, nkv: int, hd: int, eps: float, qk_norm: bool):
        super().__init__()
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.q_proj = nn.Linear(hidden, nh * hd, bias=False)
        self.k_proj = nn.Linear(hidden, nkv * hd, bias=False)
        self.v_proj = nn.Linear(hidden, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, hidden, bias=False)
        if qk_norm:
            self.q_norm, self.k_norm = RMSNorm(hd, eps), RMSNorm(hd, eps)
        else:
            self.q_norm = self.k_norm = nn.Identity()

    def forward(self, x, cos, sin, mask, k_cache, v_cache):
        """x [B,S,H]; cos/sin [B,1,S,hd]; mask [B,1,S,C+S] additive; caches [B,nkv,C,hd] -> out, new K/V rows."""
        B, S, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, S, self.nh, self.hd)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, S, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(B, S, self.nkv, self.hd).transpose(1, 2)
        q, k = rotate(q, cos, sin, self.hd), rotate(k, cos, sin, self.hd)
        o = grouped_attention(q, torch.cat((k_cache, k), dim=2), torch.cat((v_cache, v), dim=2), mask)
        return self.o_proj(o.transpose(1, 2).reshape(B, S, self.nh * self.hd)), k, v


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c: LMConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                                   c.rms_norm_eps, qk_norm=True)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c.hidden_size, c.intermediate_size)

    def forward(self, x, cos, sin, mask, k_cache, v_cache):
        a, k, v = self.self_attn(self.input_layernorm(x), cos, sin, mask, k_cache, v_cache)
        h = x + a
        return h + self.mlp(self.post_attention_layernorm(h)), k, v


class TalkerBackbone(nn.Module):
    def __init__(self, cfg: Qwen3TTSConfig):
        super().__init__()
        c = cfg.talker
        self.codec_embedding = nn.Embedding(c.vocab_size, c.hidden_size)
        self.text_embedding = nn.Embedding(cfg.text_vocab_size, cfg.text_hidden_size)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class TextProjection(nn.Module):
    def __init__(self, cfg: Qwen3TTSConfig):
        super().__init__()
        self.linear_fc1 = nn.Linear(cfg.text_hidden_size, cfg.text_hidden_size)
        self.linear_fc2 = nn.Linear(cfg.text_hidden_size, cfg.talker.hidden_size)

    def forward(self, x):
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class PredictorBackbone(nn.Module):
    def __init__(self, cfg: Qwen3TTSConfig):
        super().__init__()
        c = cfg.predictor
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.codec_embedding = nn.ModuleList(nn.Embedding(c.vocab_size, cfg.talker.hidden_size)
                                             for _ in range(cfg.num_code_groups - 1))


class CodePredictor(nn.Module):
    def __init__(self, cfg: Qwen3TTSConfig):
        super().__init__()
        c = cfg.predictor
        self.model = PredictorBackbone(cfg)
        self.lm_head = nn.ModuleList(nn.Linear(c.hidden_size, c.vocab_size, bias=False)
                                     for _ in range(cfg.num_code_groups - 1))
        if c.hidden_size != cfg.talker.hidden_size:
            self.small_to_mtp_projection = nn.Linear(cfg.talker.hidden_size, c.hidden_size, bias=True)
        else:
            self.small_to_mtp_projection = nn.Identity()


class Talker(nn.Module):
    def __init__(self, cfg: Qwen3TTSConfig):
        super().__init__()
        self.model = TalkerBackbone(cfg)
        self.text_projection = TextProjection(cfg)
        self.codec_head = nn.Linear(cfg.talker.hidden_size, cfg.talker.vocab_size, bias=False)
        self.code_predictor = CodePredictor(cfg)


# ----------------------------------------------------------------------------------------------
# Code2Wav: the 12 Hz tokenizer decoder


class CausalConv(nn.Module):
    """Left-padded conv (stride 1): pads ``(k-1)*dilation`` zeros, so output t sees inputs <= t."""

    def __init__(self, cin, cout, k, dilation=1, groups=1):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, k, dilation=dilation, groups=groups)
        self.tail = (k - 1) * dilation   # input samples of left context the conv needs

    def forward(self, x):
        return self.conv(F.pad(x, (self.tail, 0)))

    def step(self, x, tail):
        """Streaming: ``tail`` [B,C,self.tail] holds the previous inputs; returns output and the new tail."""
        xx = torch.cat((tail, x), dim=-1)
        return self.conv(xx), xx[..., xx.shape[-1] - self.tail:]


class CausalTransConv(nn.Module):
    """Transposed conv (kernel k, stride s) with the last ``k - s`` samples trimmed: output length L*s."""

    def __init__(self, cin, cout, k, s):
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, k, stride=s)
        self.k, self.s = k, s
        self.tail = 1 if k > s else 0  # input frames whose output overlaps the next chunk (k <= 2s here)

    def forward(self, x):
        y = self.conv(x)
        return y[..., : y.shape[-1] - (self.k - self.s)] if self.k > self.s else y

    def step(self, x, tail):
        if self.tail == 0:
            return self.forward(x), tail
        y = self.conv(torch.cat((tail, x), dim=-1))  # [(L+1)*s + (k-s)]; the first s belong to the last chunk
        L = x.shape[-1]
        return y[..., self.s: self.s + L * self.s], x[..., L - 1:]


class SnakeBeta(nn.Module):
    """x + 1/(exp(beta)+1e-9) * sin(x*exp(alpha))^2, written as the official module (pow 2)."""

    def __init__(self, dim):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(dim))
        self.beta = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        alpha = torch.exp(self.alpha)[None, :, None]
        beta = torch.exp(self.beta)[None, :, None]
        return x + (1.0 / (beta + 1e-9)) * torch.pow(torch.sin(x * alpha), 2)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(1e-6 * torch.ones(dim))

    def _rest(self, x, h):
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(h.transpose(1, 2)))))
        return x + (self.gamma * h).transpose(1, 2)

    def forward(self, x):
        return self._rest(x, self.dwconv(x))

    def step(self, x, tail):
        h, tail = self.dwconv.step(x, tail)
        return self._rest(x, h), tail


class ResidualUnit(nn.Module):
    def __init__(self, dim, dilation):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv(dim, dim, 1)

    def forward(self, x):
        return x + self.conv2(self.act2(self.conv1(self.act1(x))))

    def step(self, x, tail):
        h, tail = self.conv1.step(self.act1(x), tail)
        return x + self.conv2(self.act2(h)), tail


class DecoderBlock(nn.Module):
    def __init__(self, c: DecoderConfig, i: int):
        super().__init__()
        cin, cout, r = c.decoder_dim // 2 ** i, c.decoder_dim // 2 ** (i + 1), c.upsample_rates[i]
        self.block = nn.ModuleList([SnakeBeta(cin), CausalTransConv(cin, cout, 2 * r, r)]
                                   + [ResidualUnit(cout, d) for d in (1, 3, 9)])


class DecoderLayer(nn.Module):
    def __init__(self, c: DecoderConfig):
        super().__init__()
        self.self_attn = Attention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                                   c.rms_norm_eps, qk_norm=False)
        self.mlp = MLP(c.hidden_size, c.intermediate_size)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(c)
        self.mlp_layer_scale = LayerScale(c)

    def forward(self, x, cos, sin, mask, k_cache, v_cache):
        a, k, v = self.self_attn(self.input_layernorm(x), cos, sin, mask, k_cache, v_cache)
        h = x + self.self_attn_layer_scale(a)
        return h + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(h))), k, v


class LayerScale(nn.Module):
    def __init__(self, c: DecoderConfig):
        super().__init__()
        self.scale = nn.Parameter(torch.full((c.hidden_size,), c.layer_scale_initial_scale))

    def forward(self, x):
        return self.scale * x


class PreTransformer(nn.Module):
    def __init__(self, c: DecoderConfig):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.input_proj = nn.Linear(c.latent_dim, c.hidden_size)
        self.output_proj = nn.Linear(c.hidden_size, c.latent_dim)


class Codebook(nn.Module):
    def __init__(self, n, dim):
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(n))
        self.embedding_sum = nn.Parameter(torch.zeros(n, dim))

    def table(self) -> torch.Tensor:
        return self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None]


class VQLayer(nn.Module):
    def __init__(self, n, dim):
        super().__init__()
        self._codebook = Codebook(n, dim)


class RVQ(nn.Module):
    def __init__(self, c: DecoderConfig, n_q: int):
        super().__init__()
        dim = c.codebook_dim // 2
        self.input_proj = nn.Conv1d(c.codebook_dim, dim, 1, bias=False)  # encoder side; kept so keys match
        self.output_proj = nn.Conv1d(dim, c.codebook_dim, 1, bias=False)
        self.vq = nn.Module()
        self.vq.layers = nn.ModuleList(VQLayer(c.codebook_size, dim) for _ in range(n_q))

    def tables(self) -> list[torch.Tensor]:
        """Each codebook folded through the 1x1 output projection: [codebook_size, codebook_dim]."""
        w = self.output_proj.weight[:, :, 0]  # [codebook_dim, dim]
        return [layer._codebook.table() @ w.T for layer in self.vq.layers]


class SplitRVQ(nn.Module):
    def __init__(self, c: DecoderConfig):
        super().__init__()
        self.rvq_first = RVQ(c, 1)
        self.rvq_rest = RVQ(c, c.num_quantizers - 1)

    def tables(self) -> torch.Tensor:
        """[num_quantizers, codebook_size, codebook_dim]: dequantization is a sum of 16 gathers."""
        return torch.stack(self.rvq_first.tables() + self.rvq_rest.tables())


class Code2Wav(nn.Module):
    """``Qwen3TTSTokenizerV2Decoder``: codes [B,16,T] -> wav [B,1,T*samples_per_frame]."""

    def __init__(self, c: DecoderConfig):
        super().__init__()
        self.config = c
        self.quantizer = SplitRVQ(c)
        self.pre_conv = CausalConv(c.codebook_dim, c.latent_dim, 3)
        self.pre_transformer = PreTransformer(c)
        self.upsample = nn.ModuleList(nn.ModuleList([CausalTransConv(c.latent_dim, c.latent_dim, f, f),
                                                     ConvNeXtBlock(c.latent_dim)]) for f in c.upsampling_ratios)
        out_dim = c.decoder_dim // 2 ** len(c.upsample_rates)
        self.decoder = nn.ModuleList([CausalConv(c.latent_dim, c.decoder_dim, 7)]
                                     + [DecoderBlock(c, i) for i in range(len(c.upsample_rates))]
                                     + [SnakeBeta(out_dim), CausalConv(out_dim, 1, 7)])

    def latents(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B,16,T] (int) -> [B,codebook_dim,T] via the folded gather tables."""
        tables = self.quantizer.tables()
        return sum(F.embedding(codes[:, j], tables[j]) for j in range(tables.shape[0])).transpose(1, 2)

    def conv_stack(self) -> list[nn.Module]:
        """Every module with streaming state after the transformer, in order."""
        mods = []
        for up in self.upsample:
            mods += list(up)
        for m in self.decoder:
            mods += list(m.block) if isinstance(m, DecoderBlock) else [m]
        return mods

    def forward(self, codes):
        c = self.config
        h = self.pre_conv(self.latents(codes)).transpose(1, 2)
        T = h.shape[1]
        pos = np.arange(T)
        cos, sin = (torch.from_numpy(a)[None, None] for a in rope_table(c.head_dim, c.rope_theta, pos))
        i, j = np.meshgrid(pos, pos, indexing="ij")
        ok = (j <= i) & (j > i - c.sliding_window)
        mask = torch.from_numpy(np.where(ok, 0.0, -1e9).astype(np.float32))[None, None]
        t = self.pre_transformer
        x = t.input_proj(h)
        empty = torch.zeros(1, c.num_key_value_heads, 0, c.head_dim)
        for layer in t.layers:
            x, _, _ = layer(x, cos, sin, mask, empty, empty)
        x = t.output_proj(t.norm(x)).transpose(1, 2)
        for m in self.conv_stack():
            x = m(x)
        return x.clamp(-1.0, 1.0)


class Qwen3TTS(nn.Module):
    """The whole model: ``talker`` (with its code predictor) and ``speech_tokenizer.decoder`` (Code2Wav)."""

    def __init__(self, cfg: Qwen3TTSConfig):
        super().__init__()
        self.config = cfg
        self.talker = Talker(cfg)
        self.speech_tokenizer = nn.Module()
        self.speech_tokenizer.decoder = Code2Wav(cfg.decoder)

    def expected_keys(self) -> dict[str, tuple[int, ...]]:
        return {k: tuple(v.shape) for k, v in self.state_dict().items()}


def init_random(model: Qwen3TTS, seed: int) -> Qwen3TTS:
    """Seeded fan-in-scaled random weights. The HF default init zeroes the codebooks and Snake parameters (the
    decoder then outputs exact zeros), so every tensor gets a meaningful value here: norms near 1, embeddings
    and codebooks N(0,1), Snake log-parameters N(0, 0.1^2), LayerScale and ConvNeXt gamma at the config scale,
    cluster usage near 1; the last conv is scaled by ``OUT_SCALE`` so the waveform stays mostly inside the final
    clamp (a clipped waveform would hide errors from parity). The talker's control-id rows of codec_head are scaled down (x0.2) so that greedy
    decoding of random weights yields codebook-0 codes, as a trained talker does until it emits EOS."""
    g = torch.Generator().manual_seed(seed)
    n_codes = model.config.decoder.codebook_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if name.endswith(("norm.weight", "layernorm.weight")):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif leaf in ("alpha", "beta"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif leaf == "scale" or leaf == "gamma":
                p.copy_(torch.full(p.shape, 0.1) * (1.0 + 0.1 * torch.randn(p.shape, generator=g)))
            elif leaf == "cluster_usage":
                p.copy_(1.0 + 0.5 * torch.rand(p.shape, generator=g))
            elif leaf in ("embedding_sum",) or "embedding" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            elif leaf == "bias":
                p.copy_(0.02 * torch.randn(p.shape, generator=g))
            else:  # Linear [out,in], Conv1d [out,in/g,k], ConvTranspose1d [in,out,k]
                fan_in = p.shape[0] * p.shape[2] if name.endswith("conv.weight") and _is_trans(model, name) \
                    else int(np.prod(p.shape[1:]))
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
        model.talker.codec_head.weight[n_codes:] *= 0.2
        model.speech_tokenizer.decoder.decoder[-1].conv.weight *= OUT_SCALE
    return model


OUT_SCALE = 0.05


def _is_trans(model: nn.Module, pname: str) -> bool:
    return isinstance(model.get_submodule(pname.rsplit(".", 1)[0]), nn.ConvTranspose1d)


# ----------------------------------------------------------------------------------------------
# Host-side tables (fp32, never inside a graph)


def rope_table(head_dim: int, theta: float, positions) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [S, head_dim] for rotate-half RoPE (fp64 then fp32). Talker MRoPE with text-only positions is
    exactly this 1D RoPE (the three position axes are identical)."""
    inv = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inv[None, :]
    ang = np.concatenate([ang, ang], axis=-1)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


# ----------------------------------------------------------------------------------------------
# Exported graphs


class TalkerStep(nn.Module):
    """One talker decode step over a static cache of ``context`` rows.

    Inputs: ``embeds`` [1,1,H] (codec + text embeddings summed on the host), ``cos``/``sin`` [1,1,1,hd],
    ``mask`` [1,1,1,C+1], ``k_cache_i``/``v_cache_i`` [1,nkv,C,hd]. Outputs: ``logits`` [1,1,3072] (codebook 0 and
    control ids), ``hidden`` [1,1,H] (final-norm state that seeds the code predictor), new K/V rows."""

    def __init__(self, talker: Talker):
        super().__init__()
        self.layers, self.norm, self.codec_head = talker.model.layers, talker.model.norm, talker.codec_head

    def forward(self, embeds, cos, sin, mask, *caches):
        x, new = embeds, []
        for i, layer in enumerate(self.layers):
            x, k, v = layer(x, cos, sin, mask, caches[2 * i], caches[2 * i + 1])
            new += [k, v]
        h = self.norm(x)
        return (self.codec_head(h), h, *new)


def _stacked_heads(cp: CodePredictor) -> torch.Tensor:
    return torch.stack([h.weight for h in cp.lm_head])  # [G-1, V, Hcp]


class PredictorStep(nn.Module):
    """One code-predictor position over a cache of ``G-1`` rows (a frame has at most G positions).

    Inputs: ``embeds`` [1,1,H_talker] (talker hidden, or a codec embedding gathered on the host), ``cos``/``sin``
    [1,1,1,hd], ``mask`` [1,1,1,G], ``head`` [1,1,G-1] one-hot (which lm_head; all are computed and the one-hot
    selects, so no integer indexes a module list), caches. Outputs: ``logits`` [1,1,V], new K/V rows.
    With ``sampler`` the graph also samples: ``u`` [1,1,1] uniform from the host, top-k at ``temperature``,
    output ``token`` [1,1,1] (float-coded id)."""

    def __init__(self, cp: CodePredictor, sampler: bool = False, top_k: int = 50, temperature: float = 0.9):
        super().__init__()
        self.proj, self.layers, self.norm = cp.small_to_mtp_projection, cp.model.layers, cp.model.norm
        self.heads = nn.Parameter(_stacked_heads(cp).detach().clone(), requires_grad=False)
        self.sampler, self.top_k, self.temperature = sampler, top_k, temperature

    def forward(self, embeds, cos, sin, mask, head, *rest):
        caches = rest[:-1] if self.sampler else rest
        x, new = self.proj(embeds), []
        for i, layer in enumerate(self.layers):
            x, k, v = layer(x, cos, sin, mask, caches[2 * i], caches[2 * i + 1])
            new += [k, v]
        h = self.norm(x)[:, 0]                                          # [1,Hcp]
        all_logits = torch.matmul(self.heads, h[0])                     # [G-1, V]
        logits = torch.matmul(head[0], all_logits)[None]                # [1,1,V]
        if not self.sampler:
            return (logits, *new)
        return (logits, sample_top_k(logits, rest[-1], self.top_k, self.temperature), *new)


def sample_top_k(logits, u, k: int, temperature: float):
    """Inverse-CDF top-k sampling with a host-supplied uniform ``u`` [1,1,1]: reproducible on every runtime."""
    vals, idx = torch.topk(logits / temperature, k, dim=-1)            # [1,1,k]
    p = torch.softmax(vals, dim=-1)
    below = (torch.cumsum(p, dim=-1) < u).to(torch.float32)            # positions whose CDF is under u
    j = torch.clamp(below.sum(dim=-1, keepdim=True), max=k - 1).to(torch.int64)
    return torch.gather(idx, -1, j).to(torch.float32)


class PredictorWindow(nn.Module):
    """The cache-free alternative: one fixed window of G positions, causal mask, every head at once.

    Inputs: ``embeds`` [1,G,H_talker] (slots after the current pass hold anything: the mask hides them),
    ``cos``/``sin`` [1,1,G,hd], ``mask`` [1,1,G,G]. Output: ``logits`` [1,G-1,V] (row j from head j at position
    j+1). The host calls it once per pass and reads row k-1 for code k."""

    def __init__(self, cp: CodePredictor):
        super().__init__()
        self.proj, self.layers, self.norm = cp.small_to_mtp_projection, cp.model.layers, cp.model.norm
        self.heads = nn.Parameter(_stacked_heads(cp).detach().clone(), requires_grad=False)

    def forward(self, embeds, cos, sin, mask):
        x = self.proj(embeds)
        nkv, hd = self.layers[0].self_attn.nkv, self.layers[0].self_attn.hd
        empty = torch.zeros(1, nkv, 0, hd)
        for layer in self.layers:
            x, _, _ = layer(x, cos, sin, mask, empty, empty)
        h = self.norm(x)[0, 1:]                                          # [G-1, Hcp]
        return (torch.matmul(self.heads, h[:, :, None])[None, :, :, 0],)  # [1,G-1,V]


class Code2WavChunk(nn.Module):
    """Exact streaming Code2Wav: one chunk of ``frames`` frames plus the carried state.

    Inputs: ``latents`` [1,codebook_dim,N] (the 16 folded codebook gathers summed on the host), ``cos``/``sin``
    [1,1,N,hd] at the chunk's absolute positions, ``mask`` [1,1,N,W-1+N], per transformer layer ``k_cache_i``/
    ``v_cache_i`` [1,nkv,W-1,hd] (the last W-1 frames, post-RoPE), then ``tail_j`` [1,C_j,L_j] for each causal
    conv (its last L_j input samples). Outputs: ``audio`` [1,1,N*spf], ``k_new_i``/``v_new_i`` [1,nkv,N,hd],
    ``tail_new_j``. Causal convs concatenate their tail instead of padding (so no padded conv is in the graph)."""

    def __init__(self, dec: Code2Wav, frames: int):
        super().__init__()
        self.dec, self.frames = dec, frames
        self.stateful = [dec.pre_conv] + [m for m in dec.conv_stack() if _tail_len(m) > 0]

    def tail_specs(self) -> list[tuple[int, int]]:
        """(channels, samples) of every conv tail, in input order."""
        out = []
        for m in self.stateful:
            conv = m.dwconv.conv if isinstance(m, ConvNeXtBlock) else (m.conv1.conv if isinstance(m, ResidualUnit) else m.conv)
            cin = conv.in_channels
            out.append((cin, _tail_len(m)))
        return out

    def forward(self, latents, cos, sin, mask, *state):
        d, c = self.dec, self.dec.config
        nl = c.num_hidden_layers
        caches, tails = state[: 2 * nl], list(state[2 * nl:])
        new_tails = []
        h, t0 = d.pre_conv.step(latents, tails[0])
        new_tails.append(t0)
        t = d.pre_transformer
        x, new_kv = t.input_proj(h.transpose(1, 2)), []
        for i, layer in enumerate(t.layers):
            x, k, v = layer(x, cos, sin, mask, caches[2 * i], caches[2 * i + 1])
            new_kv += [k, v]
        x = t.output_proj(t.norm(x)).transpose(1, 2)
        j = 1
        for m in d.conv_stack():
            if _tail_len(m) > 0:
                x, tj = m.step(x, tails[j])
                new_tails.append(tj)
                j += 1
            else:
                x = m(x)
        return (x.clamp(-1.0, 1.0), *new_kv, *new_tails)


def _tail_len(m: nn.Module) -> int:
    if isinstance(m, ConvNeXtBlock):
        return m.dwconv.tail
    if isinstance(m, ResidualUnit):
        return m.conv1.tail
    return getattr(m, "tail", 0)   # causal (transposed) convs and their rewritten forms (exporters.rewrites)


# ----------------------------------------------------------------------------------------------
# Checkpoints: the released model directory with the tokenizer in ``speech_tokenizer/``

TOKENIZER_DIR = "speech_tokenizer"


def load_checkpoint(ckpt: Path):
    """-> (config, state_dict, weights hash). Talker + predictor keys from ``<ckpt>/*.safetensors`` (the Base
    models' ``speaker_encoder.*`` is ignored), decoder keys from ``<ckpt>/speech_tokenizer/*.safetensors``
    (its ``encoder.*`` is ignored) under the prefix ``speech_tokenizer.``."""
    from ..artifacts.hashing import hash_value
    from ..errors import CheckpointError
    from .checkpoint import checkpoint_hash, load_state_dict, read_config

    ckpt = Path(ckpt)
    tok = ckpt / TOKENIZER_DIR
    if not tok.is_dir():
        raise CheckpointError(f"checkpoint {ckpt} has no {TOKENIZER_DIR}/ directory (the 12 Hz tokenizer)")
    try:
        cfg = Qwen3TTSConfig.from_hf(read_config(ckpt), read_config(tok))
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint {ckpt}: config.json does not describe a Qwen3-TTS 12 Hz model: {e}") from None
    expected = Qwen3TTS(cfg).expected_keys()
    opt = ("talker.code_predictor.small_to_mtp_projection.",)
    main = {k: v for k, v in expected.items() if k.startswith("talker.")}
    dec = {k[len("speech_tokenizer."):]: v for k, v in expected.items() if k.startswith("speech_tokenizer.")}
    state = load_state_dict(ckpt, main, ignore_prefixes=("speaker_encoder.",), optional=opt)
    state |= {f"speech_tokenizer.{k}": v for k, v in load_state_dict(tok, dec, ignore_prefixes=("encoder.",)).items()}
    return cfg, state, hash_value([checkpoint_hash(ckpt), checkpoint_hash(tok)])


def save_checkpoint(model: Qwen3TTS, ckpt: Path) -> None:
    """Write the official layout (tests, and a stand-in for a downloaded model directory)."""
    from safetensors.torch import save_file

    from ..artifacts.store import atomic_dir

    hf = model.config.to_hf()
    sd = model.state_dict()
    with atomic_dir(Path(ckpt)) as tmp:
        (tmp / "config.json").write_text(json.dumps({"model_type": "qwen3_tts", "talker_config": hf["talker_config"]}, indent=2))
        save_file({k: v.contiguous() for k, v in sd.items() if k.startswith("talker.")}, str(tmp / "model.safetensors"))
        (tmp / TOKENIZER_DIR).mkdir()
        (tmp / TOKENIZER_DIR / "config.json").write_text(json.dumps(hf["speech_tokenizer"] | {
            "model_type": "qwen3_tts_tokenizer_12hz", "output_sample_rate": model.config.decoder.sample_rate}, indent=2))
        save_file({k[len("speech_tokenizer."):]: v.contiguous() for k, v in sd.items() if k.startswith("speech_tokenizer.")},
                  str(tmp / TOKENIZER_DIR / "model.safetensors"))


def _family():
    from . import Family

    def comp(kind):
        def make(bundle, context: int, **options):
            from ..components import qwen3_tts_code2wav, qwen3_tts_predictor, qwen3_tts_talker
            return {"talker_step": lambda: qwen3_tts_talker.TalkerStepComponent(bundle, context, **options),
                    "code_predictor_step": lambda: qwen3_tts_predictor.PredictorStepComponent(bundle, context, **options),
                    "code_predictor_window": lambda: qwen3_tts_predictor.PredictorWindowComponent(bundle, context, **options),
                    "code2wav_first": lambda: qwen3_tts_code2wav.Code2WavComponent(bundle, context, frames=1, **options),
                    "code2wav": lambda: qwen3_tts_code2wav.Code2WavComponent(bundle, context, frames=25, **options)}[kind]()
        return make

    def end_to_end(pipe, comps, results):
        from ..components.qwen3_tts_e2e import end_to_end
        return end_to_end(pipe, comps, results)

    names = ("talker_step", "code_predictor_step", "code_predictor_window", "code2wav_first", "code2wav")
    return Family(
        name="qwen3_tts",
        presets=PRESETS,
        config_from_hf=lambda d: Qwen3TTSConfig.from_hf(d, d.get("speech_tokenizer", {})),
        config_to_hf=Qwen3TTSConfig.to_hf,
        build=Qwen3TTS,
        init_random=init_random,
        expected_keys=lambda m: m.expected_keys(),
        components={n: comp(n) for n in names},
        load_checkpoint=load_checkpoint,
        end_to_end=end_to_end,
    )


FAMILY = _family()
