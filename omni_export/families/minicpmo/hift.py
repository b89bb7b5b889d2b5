"""HiFT (NSF + iSTFTNet, stepaudio2 ``HiFTGenerator``): F0 predictor, conv_pre, transposed-conv upsampling x[8,5,3]
with ResBlocks (Snake) and the source branch, conv_post -> magnitude exp(ch 0:9) and phase sin(ch 9:18), iSTFT.
Parameter names are the ``hift.pt`` keys with weight norm folded (``fold_weight_norm`` on load).

``torch.stft`` / ``torch.istft`` do not export (complex types); both are written here as convolutions with fixed
DFT bases (``STFT.stft`` / ``STFT.istft``: n_fft 16, hop 4, Hann, centred), the same function to rounding.
The NSF source (random initial phases, noise, the cumulative phase) is computed on the host (``nsf_harmonics``)
from a seeded generator and fed in as the 9 harmonic rows; the graph applies ``m_source.l_linear`` + tanh.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ...blocks.graph_forms import channel_rows
from .config import HiFTConfig


def hann(n: int) -> np.ndarray:
    """Periodic Hann window (scipy ``get_window("hann", n, fftbins=True)``), fp64."""
    return 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / n)


def dft_bases(n_fft: int) -> tuple[np.ndarray, np.ndarray]:
    """Analysis kernel [n/2+1 + n/2-1, 1, n] (windowed cos rows, then the -sin rows of bins 1..n/2-1: the DC and
    Nyquist sines are identically zero) and the synthesis kernel of the same rows (the onesided inverse DFT weights
    times the window, as ``torch.istft`` applies them; it ignores the imaginary DC and Nyquist parts). No all-zero
    kernel row: a per-channel weight quantizer has no scale for one."""
    k = np.arange(n_fft // 2 + 1)[:, None]
    n = np.arange(n_fft)[None]
    w = hann(n_fft)
    ang = 2 * np.pi * k * n / n_fft
    analysis = np.concatenate([np.cos(ang) * w, -np.sin(ang[1:-1]) * w])[:, None]
    c = np.full((n_fft // 2 + 1, 1), 2.0)
    c[0] = c[-1] = 1.0            # DC and Nyquist once
    syn_re, syn_im = c * np.cos(ang) / n_fft * w, -c[1:-1] * np.sin(ang[1:-1]) / n_fft * w
    return analysis, np.concatenate([syn_re, syn_im])[:, None]


# The HTP lays a conv's activations out channel-last in blocks of 32 along the length: a length that is not a multiple
# of 32 made each elementwise op of the tiny preset's last stage (4 channels, 12,001 frames) ~100x slower on the HTP
# simulator than at 12,032 frames (QNN profile, cycles per op; docs/minicpmo.md).
ALIGN = 32
# Snake on a length that is a multiple of ROW runs on rows of ROW samples (``Snake.forward``): on the HTP simulator a
# conv -> Snake -> conv block of 4 channels x 12,032 samples took 193 M cycles channel-last and 41 M on rows of 128.
ROW = 128


class STFT(nn.Module):
    """Centred STFT / iSTFT as conv1d / conv_transpose1d with fixed bases (buffers, not parameters)."""

    def __init__(self, n_fft: int, hop: int):
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        a, s = dft_bases(n_fft)
        # numpy copies with their own strides: the ``[:, None]`` views have a zero stride on the size-1 axis, which
        # torch keeps and ExecuTorch refuses in a constant
        self.register_buffer("analysis", torch.from_numpy(a.copy()), persistent=False)
        self.register_buffer("synthesis", torch.from_numpy(s.copy()), persistent=False)
        self.register_buffer("win_sq", torch.from_numpy(hann(n_fft) ** 2)[None, None], persistent=False)

    def stft(self, x):
        """[B,1,L] -> [B, n+2, L/hop + 1] (real rows, then imaginary rows), reflect-padded by n/2 as torch.stft."""
        x = F.pad(x, (self.n_fft // 2, self.n_fft // 2), mode="reflect")
        y = F.conv1d(x, self.analysis.to(x.dtype), stride=self.hop)
        h = self.n_fft // 2 + 1
        zero = torch.zeros_like(y[:, :1])
        return torch.cat((y[:, :h], zero, y[:, h:], zero), dim=1)

    def istft(self, real, imag):
        """[B, n/2+1, F] each -> [B, (F-1)*hop]: windowed overlap-add divided by the window-square envelope."""
        spec = torch.cat((real, imag[:, 1:-1]), dim=1)
        y = F.conv_transpose1d(spec, self.synthesis.to(real.dtype), stride=self.hop)
        ones = torch.ones(1, 1, real.shape[-1], dtype=real.dtype)
        env = F.conv_transpose1d(ones, self.win_sq.to(real.dtype), stride=self.hop)
        h = self.n_fft // 2          # trimmed before dividing: the envelope is 0 at the first sample (0/0)
        return y[:, 0, h: y.shape[-1] - h] / env[:, 0, h: env.shape[-1] - h]


class Snake(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(ch))

    def forward(self, x):
        a = self.alpha[None, :, None]
        B, C, L = x.shape
        if L % ROW:
            s = torch.sin(x * a)
            return x + (1.0 / (a + 1e-9)) * (s * s)
        # on rows, each with its channel's alpha (4 channels: 5.5x fewer HTP cycles, ROW)
        z, (a,) = channel_rows(x, ROW, a)
        s = torch.sin(z * a)
        return (z + (1.0 / (a + 1e-9)) * (s * s)).reshape(B, C, L)


class ResBlock(nn.Module):
    def __init__(self, ch: int, k: int, dilations):
        super().__init__()
        self.convs1 = nn.ModuleList(nn.Conv1d(ch, ch, k, dilation=d, padding=(k * d - d) // 2) for d in dilations)
        self.convs2 = nn.ModuleList(nn.Conv1d(ch, ch, k, padding=(k - 1) // 2) for _ in dilations)
        self.activations1 = nn.ModuleList(Snake(ch) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(ch) for _ in dilations)

    def forward(self, x):
        for c1, c2, a1, a2 in zip(self.convs1, self.convs2, self.activations1, self.activations2):
            x = x + c2(a2(c1(a1(x))))
        return x


class F0Predictor(nn.Module):
    """``ConvRNNF0Predictor``: 5 x (Conv1d k3 + ELU) -> Linear -> |x|; mel [B,80,N] -> f0 [B,N]."""

    def __init__(self, c: HiFTConfig):
        super().__init__()
        layers = []
        for i in range(5):
            layers += [nn.Conv1d(c.mel if i == 0 else c.f0_channels, c.f0_channels, 3, padding=1), nn.ELU()]
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(c.f0_channels, 1)

    def forward(self, mel):
        return torch.abs(self.classifier(self.condnet(mel).transpose(1, 2))[..., 0])


class HiFT(nn.Module):
    def __init__(self, c: HiFTConfig):
        super().__init__()
        self.config = c
        B, n2 = c.base_channels, c.n_fft + 2
        self.m_source = nn.Module()
        self.m_source.l_linear = nn.Linear(c.nb_harmonics + 1, 1)
        self.conv_pre = nn.Conv1d(c.mel, B, 7, padding=3)
        self.ups = nn.ModuleList(nn.ConvTranspose1d(B // 2 ** i, B // 2 ** (i + 1), k, u, padding=(k - u) // 2)
                                 for i, (u, k) in enumerate(zip(c.upsample_rates, c.upsample_kernel_sizes)))
        cum = np.cumprod([1] + list(c.upsample_rates[::-1][:-1]))[::-1]
        self.source_downs = nn.ModuleList(
            nn.Conv1d(n2, B // 2 ** (i + 1), 1) if u == 1
            else nn.Conv1d(n2, B // 2 ** (i + 1), 2 * u, u, padding=u // 2)
            for i, u in enumerate(int(x) for x in cum))
        self.source_resblocks = nn.ModuleList(ResBlock(B // 2 ** (i + 1), k, c.resblock_dilations)
                                              for i, k in enumerate(c.source_resblock_kernel_sizes))
        self.resblocks = nn.ModuleList(ResBlock(B // 2 ** (i + 1), k, c.resblock_dilations)
                                       for i in range(len(c.upsample_rates)) for k in c.resblock_kernel_sizes)
        self.conv_post = nn.Conv1d(B // 2 ** len(c.upsample_rates), n2, 7, padding=3)
        self.f0_predictor = F0Predictor(c)
        self.stft = STFT(c.n_fft, c.hop_len)

    def source(self, harmonics):
        """[B,9,L] host NSF harmonics -> [B,1,L] excitation (``l_linear`` + tanh)."""
        return torch.tanh(self.m_source.l_linear(harmonics.transpose(1, 2))).transpose(1, 2)

    def decode(self, mel, harmonics):
        """mel [B,80,N], harmonics [B,9,N*480] -> audio [B, N*480]."""
        c, nk = self.config, len(self.config.resblock_kernel_sizes)
        s = self.stft.stft(self.source(harmonics))
        frames = s.shape[-1]
        x = self.conv_pre(mel)
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, c.lrelu_slope))
            src = self.source_downs[i](s)
            if i == len(self.ups) - 1:
                # the last stage runs at the STFT frame rate (L/hop + 1 frames), zero-extended to a multiple of
                # ALIGN frames and cut back before the iSTFT: only the last frames' edge changes, inside what a
                # stream window discards (hift_host.CONTEXT), and the HTP's elementwise ops stay fast (ALIGN)
                x = F.pad(F.pad(x, (1, 0), mode="reflect"), (0, -frames % ALIGN))
                src = F.pad(src, (0, -frames % ALIGN))
            x = x + self.source_resblocks[i](src)
            x = sum(self.resblocks[i * nk + j](x) for j in range(nk)) / nk
        x = self.conv_post(F.leaky_relu(x))
        h = c.n_fft // 2 + 1
        mag = torch.clamp(torch.exp(x[:, :h]), max=1e2)
        ph = torch.sin(x[:, h:])
        real, imag = (mag * torch.cos(ph))[..., :frames], (mag * torch.sin(ph))[..., :frames]
        return torch.clamp(self.stft.istft(real, imag), -c.audio_limit, c.audio_limit)


class HiFTDecode(nn.Module):
    """Graph: ``mel`` [1,80,N], ``harmonics`` [1,9,N*480] -> ``audio`` [1,N*480]."""

    def __init__(self, hift: HiFT):
        super().__init__()
        self.hift = hift

    def forward(self, mel, harmonics):
        return (self.hift.decode(mel, harmonics),)


class F0Graph(nn.Module):
    """Graph: ``mel`` [1,80,N] -> ``f0`` [1,N] (Hz)."""

    def __init__(self, hift: HiFT):
        super().__init__()
        self.f0 = hift.f0_predictor

    def forward(self, mel):
        return (self.f0(mel),)


def nsf_harmonics(f0: np.ndarray, c: HiFTConfig, noise: np.ndarray) -> np.ndarray:
    """The NSF sine source on the host (``SineGen2``, fp64): f0 [n] Hz per mel frame -> [9, n*spf] harmonic rows
    (voiced sines + noise); ``noise`` [9, >= n*spf] standard normal, indexed by absolute sample (a seeded table, as
    the causal upstream vocoder keeps one). Upstream's nearest x spf, linear /spf (every frame's value: the random
    initial phase added at sample 0 never reaches it), cumulative phase, linear x spf (align_corners False)."""
    up, H = c.samples_per_frame, c.nb_harmonics + 1
    f0 = np.asarray(f0, np.float64)
    rad = (f0[:, None] * np.arange(1, H + 1)[None] / c.sampling_rate) % 1.0           # [n, 9]
    phase = np.cumsum(rad, axis=0) * 2 * np.pi * up
    n = f0.shape[0]
    src = np.clip((np.arange(n * up) + 0.5) / up - 0.5, 0.0, None)
    i0 = np.floor(src).astype(np.int64)
    i1, w = np.minimum(i0 + 1, n - 1), (src - i0)[:, None]
    sines = c.nsf_alpha * np.sin(phase[i0] * (1 - w) + phase[i1] * w)                  # [n*up, 9]
    uv = (np.repeat(f0, up) > c.nsf_voiced_threshold).astype(np.float64)[:, None]
    amp = uv * c.nsf_sigma + (1 - uv) * c.nsf_alpha / 3
    return (sines * uv + amp * noise[:, : n * up].T).T
