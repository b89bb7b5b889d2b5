"""MiniCPM-o 4.5 speech output as one module: ``tts`` (the TTS head), ``flow`` (encoder + DiT estimator, the
``flow.pt`` keys) and ``hift`` (the ``hift.pt`` keys, weight norm folded).

Seeded weights are fan-in scaled (``init_random``): norms near 1, biases small, embeddings N(0, 1), the adaLN
modulations scaled by ``ADALN_SCALE`` so the 16-block DiT's residual stream stays O(1), as a trained one does;
HiFT's ``conv_post`` and F0 classifier scaled so the audio stays inside its clamp and f0 is voice-like.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from .config import MiniCPMOConfig
from .dit import DiT
from .encoder import Flow
from .tts import TTSHead

ADALN_SCALE = 0.3
HIFT_POST_SCALE = 0.1   # magnitudes exp(conv_post) near 1: random weights would otherwise saturate the 0.99 clamp
F0_SCALE = 300.0        # f0 of a few hundred Hz, so the NSF source's voiced branch (f0 > 10 Hz) is exercised


class MiniCPMOSpeech(nn.Module):
    def __init__(self, cfg: MiniCPMOConfig):
        super().__init__()
        self.config = cfg
        self.tts = TTSHead(cfg)
        self.flow = Flow(cfg.encoder, DiT(cfg.dit))
        from .hift import HiFT  # noqa: PLC0415  (HiFT pulls the NSF source helpers)
        self.hift = HiFT(cfg.hift)

    def expected_keys(self) -> dict[str, tuple[int, ...]]:
        return {k: tuple(v.shape) for k, v in self.state_dict().items()}


def _fan_in(name: str, p: torch.Tensor, module: nn.Module) -> int:
    owner = module.get_submodule(name.rsplit(".", 1)[0])
    if isinstance(owner, nn.ConvTranspose1d):
        return p.shape[0] * p.shape[2]
    return int(math.prod(p.shape[1:]))


def init_random(model: nn.Module, seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if p.ndim == 1 and leaf == "weight":                      # LayerNorm / RMSNorm
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif leaf == "bias" or leaf.startswith("pos_bias") or leaf == "alpha":
                base = 1.0 if leaf == "alpha" else 0.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
            elif "embedding" in name or "emb_" in name or "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(_fan_in(name, p, model)))
            if "adaLN_modulation" in name:
                p.mul_(ADALN_SCALE)
        if isinstance(model, MiniCPMOSpeech):
            model.hift.conv_post.weight.mul_(HIFT_POST_SCALE)
            model.hift.f0_predictor.classifier.weight.mul_(F0_SCALE)
    return model
