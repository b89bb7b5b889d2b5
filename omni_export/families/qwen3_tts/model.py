"""Qwen3-TTS 12 Hz (talker, code predictor, Code2Wav decoder): an export-friendly fp32 definition.

Parameter names follow the official checkpoints, so their state dicts load without renaming:
``talker.*`` from the model's ``model.safetensors`` and ``speech_tokenizer.decoder.*`` from the tokenizer's
(``speech_tokenizer/model.safetensors`` keys ``decoder.*``). A checkpoint directory is the released model
directory with the 12 Hz tokenizer in its ``speech_tokenizer/`` subdirectory (how the released repos ship).

The talker and code predictor are Qwen3 decoder layers (q/k RMSNorm per head, GQA, SwiGLU) from ``layers``. The
Code2Wav decoder has two forms: ``forward`` (the whole code sequence at once, the reference) and ``Code2WavChunk``
(``graphs.py``: one chunk plus the carried state), which reproduces the full decode exactly.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ...blocks.layers import (Attention, CausalConv, CausalTransConv, DecoderLayer, GatedMLP, RMSNorm, causal_mask,
                       rope_table)
from .config import DecoderConfig, LMConfig, Qwen3TTSConfig

# ----------------------------------------------------------------------------------------------
# Talker and code predictor: Qwen3 layers (q/k RMSNorm per head, GQA, SwiGLU)


def qwen3_layer(c: LMConfig) -> DecoderLayer:
    attn = Attention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rms_norm_eps,
                     qk_norm=True)
    return DecoderLayer(c.hidden_size, c.rms_norm_eps, attn, GatedMLP(c.hidden_size, c.intermediate_size, F.silu))


class TalkerBackbone(nn.Module):
    def __init__(self, cfg: Qwen3TTSConfig):
        super().__init__()
        c = cfg.talker
        self.codec_embedding = nn.Embedding(c.vocab_size, c.hidden_size)
        self.text_embedding = nn.Embedding(cfg.text_vocab_size, cfg.text_hidden_size)
        self.layers = nn.ModuleList(qwen3_layer(c) for _ in range(c.num_hidden_layers))
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
        self.layers = nn.ModuleList(qwen3_layer(c) for _ in range(c.num_hidden_layers))
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


class Code2WavLayer(nn.Module):
    """A pre-transformer layer: ``layers.DecoderLayer`` with LayerScale on both residual branches."""

    def __init__(self, c: DecoderConfig):
        super().__init__()
        self.self_attn = Attention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                                   c.rms_norm_eps, qk_norm=False)
        self.mlp = GatedMLP(c.hidden_size, c.intermediate_size, F.silu)
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
        self.layers = nn.ModuleList(Code2WavLayer(c) for _ in range(c.num_hidden_layers))
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
        cos, sin = (torch.from_numpy(a)[None, None] for a in rope_table(c.inv_freq(), np.arange(T)))
        mask = causal_mask(T, c.sliding_window)
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


