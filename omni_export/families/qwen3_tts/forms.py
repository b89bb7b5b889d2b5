"""The graph forms Qwen3-TTS's own blocks need on some targets (same function in fp32), and which graph each target
gets (``target_form``, what the components' ``graph_for`` returns). Forms of shared blocks are in ``graph_forms``."""
from __future__ import annotations

import copy

import torch
import torch.nn as nn

from ...blocks.graph_forms import channel_rows, layer_norm_as_matmul, of_type, rms_norm_as_matmul, swap_modules
from ...blocks.layers import run_layers
from .graphs import PredictorStep
from .model import SnakeBeta

# SnakeBetaMul on fewer than FEW channels and a length that is a multiple of ROW runs on rows of ROW samples, as
# ``minicpmo.hift.Snake`` does: the HTP lays the convs' activations out channel-last, and on the tiny preset's last
# stages (4 and 8 channels, 48,000 and 16,000 samples) each Sin ran ~8x slower that way than on rows (QNN profile of
# the 25-frame chunk on the simulator: 27.3 -> 9.3 s a call). Wider stages keep the form they were measured in.
ROW, FEW = 128, 32


class SnakeBetaMul(nn.Module):
    """SnakeBeta with sin^2 computed as t*t: ``sin(x*a).pow(2)`` is wrong in HTP fp16, ``t*t`` is right;
    identical in fp32."""

    def __init__(self, snake: nn.Module):
        super().__init__()
        self.alpha, self.beta = snake.alpha, snake.beta

    def forward(self, x):
        alpha = torch.exp(self.alpha)[None, :, None]
        inv_beta = 1.0 / (torch.exp(self.beta)[None, :, None] + 1e-9)
        B, C, L = x.shape
        if L % ROW or C >= FEW:
            t = torch.sin(x * alpha)
            return x + inv_beta * (t * t)
        z, (alpha, inv_beta) = channel_rows(x, ROW, alpha, inv_beta)
        t = torch.sin(z * alpha)
        return (z + inv_beta * (t * t)).reshape(B, C, L)


def snake_square_as_mul(module: nn.Module) -> nn.Module:
    """Copy of ``module`` with every ``SnakeBeta`` computing sin^2 as t*t."""
    return swap_modules(module, of_type(SnakeBeta), SnakeBetaMul)


class PredictorHeadsAsLinear(nn.Module):
    """The code predictor step with its 15 stacked heads as one ``nn.Linear`` (``G-1`` x ``V`` rows) and the one-hot
    head selection as a 3-D ``bmm``: the 3-D x 1-D ``matmul`` of ``PredictorStep`` decomposes into select / sum / mm
    that the XNNPACK partitioner leaves on portable kernels (3 delegates, the heads outside XNNPACK and never
    quantized). Same function in fp32 (a linear is the same dot products)."""

    def __init__(self, step: nn.Module):
        super().__init__()
        self.proj, self.layers, self.norm = step.proj, step.layers, step.norm
        self.groups, self.vocab, hidden = step.heads.shape
        self.heads = nn.Linear(hidden, self.groups * self.vocab, bias=False)
        with torch.no_grad():
            self.heads.weight.copy_(step.heads.reshape(self.groups * self.vocab, hidden))

    def forward(self, embeds, cos, sin, mask, head, *caches):
        x, new = run_layers(self.layers, self.proj(embeds), cos, sin, mask, caches)
        all_logits = self.heads(self.norm(x).reshape(1, -1)).view(1, self.groups, self.vocab)   # [1,G-1,V]
        return (torch.bmm(head, all_logits), *new)   # [1,1,G-1] x [1,G-1,V]: XNNPACK takes a 3-D bmm, not mm


def predictor_heads_as_linear(module: nn.Module) -> nn.Module:
    """``PredictorHeadsAsLinear`` of a greedy ``PredictorStep`` (the sampler variant is returned unchanged)."""
    if isinstance(module, PredictorStep) and not module.sampler:
        return PredictorHeadsAsLinear(copy.deepcopy(module)).eval()
    return module


class SnakeBetaFolded(nn.Module):
    """SnakeBeta with ``exp(alpha)`` and ``1/(exp(beta)+1e-9)`` computed once here as [1,C,1] constants and sin^2 as
    t*t. In the graph the per-parameter exp / reciprocal / unsqueeze stay on ExecuTorch's portable kernels
    (29 reciprocals and 58 unsqueezes per Code2Wav chunk); folded, only the activation math is left, which XNNPACK
    takes. The same values in fp32 (the same exp and division, done ahead of time)."""

    def __init__(self, snake: nn.Module):
        super().__init__()
        with torch.no_grad():
            self.register_buffer("scale", torch.exp(snake.alpha.detach())[None, :, None].clone())
            self.register_buffer("inv_beta", (1.0 / (torch.exp(snake.beta.detach()) + 1e-9))[None, :, None].clone())

    def forward(self, x):
        t = torch.sin(x * self.scale)
        return x + self.inv_beta * (t * t)


def snake_folded(module: nn.Module) -> nn.Module:
    """Copy of ``module`` with every ``SnakeBeta`` (or its ``SnakeBetaMul`` form) as ``SnakeBetaFolded``."""
    return swap_modules(module, of_type(SnakeBeta, SnakeBetaMul), SnakeBetaFolded)


def xnnpack_forms(module: nn.Module) -> nn.Module:
    """Every form XNNPACK needs to delegate a Qwen3-TTS graph whole (each a no-op where its blocks are absent):
    predictor heads, SnakeBeta, LayerNorm and RMSNorm (attention is already grouped 3-D bmm:
    ``layers.grouped_attention``)."""
    out = predictor_heads_as_linear(module)
    out = copy.deepcopy(module) if out is module else out  # one copy of the weights, then every swap in place
    swap_modules(out, of_type(SnakeBeta, SnakeBetaMul), SnakeBetaFolded, copy_first=False)
    layer_norm_as_matmul(out, copy_first=False)
    return rms_norm_as_matmul(out, copy_first=False)


def target_form(target: str, module: nn.Module) -> nn.Module | None:
    """The graph ``target`` exports for a Qwen3-TTS graph ``module``, when it is not ``module`` itself: XNNPACK takes
    ``xnnpack_forms``; Core ML converts the predictor's stacked heads as one linear (as written, its 3-D x 1-D matmul
    fails ``ct.convert`` with "list index out of range"). ``None``: the module as is."""
    if target == "executorch":
        return xnnpack_forms(module)
    if target == "coreml":
        out = predictor_heads_as_linear(module)
        return None if out is module else out
    return None
