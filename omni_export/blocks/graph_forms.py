"""Graph forms: rewrites that compute the same function in fp32 with the ops a target takes, each covered by a parity
test. They know torch layers and the shared building blocks (``layers``), never a family's model; a family hands the
forms its graphs need to each target through ``Component.graph_for``.

Every rewrite returns a new module (the input is never mutated) unless told to swap in place.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn

from .layers import CausalConv, CausalTransConv, RMSNorm


def channel_rows(x: torch.Tensor, row: int, *params: torch.Tensor):
    """``x`` [B, C, L] (L a multiple of ``row``) as rows [B, C * L / row, row], and each per-channel ``[1, C, 1]``
    parameter of ``params`` expanded to one value per row: an elementwise function of a channel and its parameters
    computed on the rows is the same values (bit-identical), in a layout the HTP runs densely where a few-channel
    conv's channel-last one is slow (MiniCPM-o HiFT's Snake, Qwen3-TTS Code2Wav's SnakeBeta)."""
    B, C, L = x.shape
    n = C * (L // row)
    return x.reshape(B, n, row), [p.expand(B, C, L // row).reshape(B, n, 1) for p in params]


def swap_modules(module: nn.Module, match, make, copy_first: bool = True) -> nn.Module:
    """``module`` (a copy unless ``copy_first`` is false) with every submodule ``c`` at qualified name ``n`` where
    ``match(n, c)`` replaced by ``make(c)``: the one walker every rewrite here uses."""
    out = copy.deepcopy(module) if copy_first else module
    for name, child in list(out.named_modules()):
        for cname, c in list(child.named_children()):
            if match(f"{name}.{cname}" if name else cname, c):
                setattr(child, cname, make(c))
    return out


def of_type(*types):
    """A ``swap_modules`` match for instances of ``types``."""
    return lambda name, c: isinstance(c, types)


class LinearAsConv(nn.Module):
    """``nn.Linear`` written as a 1x1 ``Conv2d``.

    ORT's QNN quantizer ignores ``per_channel`` for MatMul (QNN has no per-channel MatMul), but applies it to
    Conv: expressing projections as 1x1 convs gives int8 weights one scale per output channel.

    Layout: the rows (every leading position) are the conv's width, [1, in, 1, rows], not its batch. The HTP compiles
    a batch of rows very slowly: one full-size Spark layer at 128 rows took 75.8 s to compile as [128, in, 1, 1]
    and 2.8 s as [1, in, 1, 128] (``benchmarks/htp_compile_layout.py``). In NHWC, which the HTP uses, [1, in, 1, rows] is
    [1, 1, rows, in]: the rows' own memory order, so the transposes around the conv cost nothing there. A single row
    needs no transpose at all.
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
        lead, n = x.shape[:-1], x.numel() // x.shape[-1]
        if n == 1:
            return self.conv(x.reshape(1, -1, 1, 1)).reshape(*lead, self.out_features)
        y = self.conv(x.reshape(1, n, -1).transpose(1, 2).unsqueeze(2))  # [1, in, 1, n]
        return y.reshape(self.out_features, n).transpose(0, 1).reshape(*lead, self.out_features)


def linear_to_conv(module: nn.Module, skip: tuple[str, ...] = ()) -> nn.Module:
    """Copy of ``module`` with every ``nn.Linear`` (except names ending in ``skip``) replaced by ``LinearAsConv``."""
    return swap_modules(module, lambda n, c: isinstance(c, nn.Linear) and not n.endswith(skip), LinearAsConv)


class CausalConvConcat(nn.Module):
    """A left-padded causal conv with the padding written as a concatenation of zeros and a padding-free conv:
    wide padded convs (effective kernel >= ~19) are wrong in HTP fp16, the concat form is right."""

    def __init__(self, causal: nn.Module):
        super().__init__()
        self.conv, self.tail = causal.conv, causal.tail

    def forward(self, x):
        if self.tail == 0:
            return self.conv(x)
        return self.conv(torch.cat((x.new_zeros(x.shape[0], x.shape[1], self.tail), x), dim=-1))


def causal_pad_as_concat(module: nn.Module) -> nn.Module:
    """Copy of ``module`` with every ``layers.CausalConv`` padding by concatenated zeros."""
    return swap_modules(module, of_type(CausalConv), CausalConvConcat)


class CausalTransConvPolyphase(nn.Module):
    """A causal transposed conv (``layers.CausalTransConv``, stride s, kernel s or 2s) as one ordinary conv with s*cout
    output channels (one per output phase; kernel k/s over the previous and current input frames) and an interleaving
    reshape. Same
    function in fp32; in HTP fp16 the ConvTranspose of the 25-frame Code2Wav chunk's last upsampler (4 x 48006
    outputs) came out wrong (0 dB) while this form is right."""

    def __init__(self, tconv: nn.Module):
        super().__init__()
        conv, s, k = tconv.conv, tconv.s, tconv.k
        if k not in (s, 2 * s):
            raise ValueError(f"polyphase rewrite needs kernel == stride or 2*stride, got {k} and {s}")
        cin, cout, _ = conv.weight.shape
        self.s, self.k, self.tail, self.cout, taps = s, k, tconv.tail, cout, k // s
        self.conv = nn.Conv1d(cin, cout * s, taps)
        w = conv.weight.detach()                       # [cin, cout, k]; tap i reads input frame t-(taps-1-i)
        taps_w = [w[:, :, (taps - 1 - i) * s:(taps - i) * s] for i in range(taps)]
        with torch.no_grad():   # output channel o*s+p
            self.conv.weight.copy_(torch.stack(taps_w, dim=-1).permute(1, 2, 0, 3).reshape(cout * s, cin, taps))
            self.conv.bias.copy_(conv.bias.detach().repeat_interleave(s))

    def _phases(self, xx):
        y = self.conv(xx)                                # [B, cout*s, L]
        b, _, n = y.shape
        return y.reshape(b, self.cout, self.s, n).transpose(2, 3).reshape(b, self.cout, n * self.s)

    def forward(self, x):
        if self.tail == 0:
            return self._phases(x)
        return self._phases(torch.cat((x.new_zeros(x.shape[0], x.shape[1], self.tail), x), dim=-1))

    def step(self, x, tail):
        if self.tail == 0:
            return self._phases(x), tail
        return self._phases(torch.cat((tail, x), dim=-1)), x[..., x.shape[-1] - self.tail:]


def trans_conv_as_polyphase(module: nn.Module) -> nn.Module:
    """Copy of ``module`` with every ``layers.CausalTransConv`` written as a polyphase ordinary conv."""
    return swap_modules(module, of_type(CausalTransConv), CausalTransConvPolyphase)


class LayerNormAsRMS(nn.Module):
    """``nn.LayerNorm`` over the last axis as ``F.rms_norm`` of the centred input plus bias: the QNN HTP EP refuses a
    quantized (w8a16) LayerNormalization node, while rms_norm lowers to ops it runs. Same function in fp32."""

    def __init__(self, ln: nn.LayerNorm):
        super().__init__()
        self.shape, self.eps, self.weight, self.bias = tuple(ln.normalized_shape), ln.eps, ln.weight, ln.bias

    def forward(self, x):
        y = torch.nn.functional.rms_norm(x - x.mean(dim=-1, keepdim=True), self.shape, self.weight, self.eps)
        return y + self.bias


def layer_norm_as_rms(module: nn.Module) -> nn.Module:
    """Copy of ``module`` with every last-axis ``nn.LayerNorm`` (with affine parameters) written as ``LayerNormAsRMS``."""
    return swap_modules(module, lambda n, c: isinstance(c, nn.LayerNorm) and len(c.normalized_shape) == 1
                        and c.weight is not None and c.bias is not None, LayerNormAsRMS)


class DilatedConvIm2col(nn.Module):
    """An unpadded stride-1 ``nn.Conv1d`` with dilation d > 1 (kernel k) as the concatenation of its k shifted input
    windows along channels (im2col) and one 1x1 conv (weight ``[cout, k*cin, 1]``, tap-major): the same products and
    sums, so the same function in fp32. In W16A16 QDQ the HTP computes a conv whose kernel spans more than 8 samples
    (dilated k=7 d=3/9, or an undilated k >= 9) at ~41 dB against ORT CPU (k <= 8: 67-74 dB); in the Qwen3-TTS Code2Wav
    chunk the residual units' dilated convs fell to 28 dB there and took the audio to ~10 dB. The 1x1 form runs at the
    undilated convs' 68-74 dB."""

    def __init__(self, conv: nn.Conv1d):
        super().__init__()
        cout, cin, k = conv.weight.shape
        self.k, self.d = k, conv.dilation[0]
        self.conv = nn.Conv1d(cin * k, cout, 1, bias=conv.bias is not None)
        with torch.no_grad():   # input channel i*cin + c is tap i of channel c
            self.conv.weight.copy_(conv.weight.detach().permute(0, 2, 1).reshape(cout, k * cin, 1))
            if conv.bias is not None:
                self.conv.bias.copy_(conv.bias.detach())

    def forward(self, x):
        n = x.shape[-1] - (self.k - 1) * self.d
        return self.conv(torch.cat([x[..., i * self.d: i * self.d + n] for i in range(self.k)], dim=1))


def _plain_dilated(c: nn.Module) -> bool:
    return (type(c) is nn.Conv1d and c.dilation[0] > 1 and c.groups == 1 and c.stride[0] == 1
            and c.padding in ((0,), "valid") and c.padding_mode == "zeros")


def dilated_conv_as_im2col(module: nn.Module) -> nn.Module:
    """Copy of ``module`` with every unpadded, ungrouped, stride-1 dilated ``nn.Conv1d`` as ``DilatedConvIm2col``."""
    return swap_modules(module, lambda n, c: _plain_dilated(c), DilatedConvIm2col)


class Int8HiLo(nn.Module):
    """A conv (or linear) as two of the same shape, summed: ``hi`` holds the weight rounded to the int8 grid the
    quantizer will use (symmetric per output channel, scale = absmax / 127, so ``hi`` quantizes exactly) and ``lo``
    the residual (|lo| <= scale / 2, quantized on its own int8 grid): about 15 bits of weight precision from two
    int8 layers, the same weight bytes as one int16 layer. The HTP computes W8A16 convs exactly against ORT CPU but
    W16A16 convs at 58-67 dB (85 dB on CPU); on the Qwen3-TTS Code2Wav waveform path, where SnakeBeta amplifies
    conv error, that is the difference between 23 dB and 33 dB of HTP audio. Same function in fp32 (``lo`` has no
    bias; ``hi + lo`` is the weight up to one rounding)."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.hi, self.lo = copy.deepcopy(layer), copy.deepcopy(layer)
        self.lo.bias = None
        w = layer.weight.detach()
        scale = w.abs().amax(dim=tuple(range(1, w.dim())), keepdim=True).clamp_min(1e-30) / 127.0
        with torch.no_grad():
            self.hi.weight.copy_(torch.round(w / scale) * scale)
            self.lo.weight.copy_(w - self.hi.weight)

    def forward(self, x):
        return self.hi(x) + self.lo(x)


def split_int8_hi_lo(module: nn.Module, names) -> nn.Module:
    """Copy of ``module`` with each conv / linear whose qualified name passes ``names`` (a predicate) as ``Int8HiLo``."""
    return swap_modules(module, lambda n, c: isinstance(c, (nn.Conv1d, nn.Conv2d, nn.Linear)) and names(n), Int8HiLo)


class RMSNormAsMatMul(nn.Module):
    """RMSNorm with the mean of squares as a matmul by a constant column of 1/H and eps as a tensor constant.

    ``F.rms_norm`` decomposes to ``mean.dim`` and ``add.Scalar`` in ExecuTorch's edge dialect, which the XNNPACK
    partitioner does not take: every norm cut the program into another delegate (26 pieces for 4 tiny layers). This
    form is one XNNPACK delegate. Same function in fp32; only summation order differs. Not for HTP: a hand-written
    norm fails QNN HTP finalization (docs/design.md), where ``F.rms_norm`` stays."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        h = norm.weight.shape[0]
        self.weight = norm.weight
        self.register_buffer("avg", torch.full((h, 1), 1.0 / h))
        self.register_buffer("eps", torch.tensor([float(norm.eps)]))

    def forward(self, x):
        return x * torch.rsqrt(torch.matmul(x * x, self.avg) + self.eps) * self.weight


def rms_norm_as_matmul(module: nn.Module, copy_first: bool = True) -> nn.Module:
    """``module`` with every ``layers.RMSNorm`` (every family's) as ``RMSNormAsMatMul``: the XNNPACK form."""
    return swap_modules(module, of_type(RMSNorm), RMSNormAsMatMul, copy_first)


class LayerNormAsMatMul(nn.Module):
    """Last-axis LayerNorm with both means as a matmul by a constant column of 1/H (as ``RMSNormAsMatMul``): the
    ``mean.dim`` and ``add.Scalar`` of ``nn.LayerNorm`` / ``LayerNormAsRMS`` stay outside XNNPACK and cut a Code2Wav
    chunk into 5 delegates. Same function in fp32; only summation order differs."""

    def __init__(self, ln: nn.Module):
        super().__init__()
        h = ln.weight.shape[0]
        self.weight, self.bias = ln.weight, ln.bias
        self.register_buffer("avg", torch.full((h, 1), 1.0 / h))
        self.register_buffer("eps", torch.tensor([float(ln.eps)]))

    def forward(self, x):
        rows = x.reshape(-1, x.shape[-1])   # 2-D: a matmul of the (transposed) 3-D input decomposes into expand + bmm
        d = rows - torch.mm(rows, self.avg)
        return (d * torch.rsqrt(torch.mm(d * d, self.avg) + self.eps) * self.weight + self.bias).view(x.shape)


def _is_affine_layer_norm(name: str, c: nn.Module) -> bool:
    return isinstance(c, LayerNormAsRMS) or (isinstance(c, nn.LayerNorm) and len(c.normalized_shape) == 1
                                             and c.weight is not None and c.bias is not None)


def layer_norm_as_matmul(module: nn.Module, copy_first: bool = True) -> nn.Module:
    """``module`` with every affine last-axis ``nn.LayerNorm`` or ``LayerNormAsRMS`` as ``LayerNormAsMatMul``."""
    return swap_modules(module, _is_affine_layer_norm, LayerNormAsMatMul, copy_first)
