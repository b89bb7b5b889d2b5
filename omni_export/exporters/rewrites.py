"""Graph rewrites some targets need, in one place, each applied per target and covered by a parity test.

Every rewrite returns a new module (the input is never mutated) that computes the same function in fp32.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn


class LinearAsConv(nn.Module):
    """``nn.Linear`` written as a 1x1 ``Conv2d``.

    ORT's QNN quantizer ignores ``per_channel`` for MatMul (QNN has no per-channel MatMul), but applies it to
    Conv: expressing projections as 1x1 convs gives int8 weights one scale per output channel.
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.out_features = linear.out_features
        self.conv = nn.Conv2d(linear.in_features, linear.out_features, 1, bias=linear.bias is not None)
        with torch.no_grad():
            self.conv.weight.copy_(linear.weight[:, :, None, None])
            if linear.bias is not None:
                self.conv.bias.copy_(linear.bias)

    def forward(self, x):
        lead = x.shape[:-1]
        y = self.conv(x.reshape(-1, x.shape[-1], 1, 1))
        return y.reshape(*lead, self.out_features)


def linear_to_conv(module: nn.Module, skip: tuple[str, ...] = ()) -> nn.Module:
    """Copy of ``module`` with every ``nn.Linear`` (except names ending in ``skip``) replaced by ``LinearAsConv``."""
    out = copy.deepcopy(module)
    for name, child in list(out.named_modules()):
        for cname, c in list(child.named_children()):
            full = f"{name}.{cname}" if name else cname
            if isinstance(c, nn.Linear) and not full.endswith(skip):
                setattr(child, cname, LinearAsConv(c))
    return out


REWRITES = {"linear_to_conv": linear_to_conv}
