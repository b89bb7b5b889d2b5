"""Qwen3-TTS Code2Wav as an exact streaming decoder: one chunk graph of ``frames`` frames plus carried state.

The host sums the 16 folded codebook gathers (the split RVQ dequantization), so the graph starts at the causal
pre-conv. State carried between chunks: every transformer layer's last ``sliding_window - 1`` K/V rows (the host
appends the new rows and keeps the last 71) and every causal conv's input tail (the graph returns the new tails).
Chunked output equals the full decode; the parity reference for ``audio`` is the full (non-streaming) decode in
fp64 (exact arithmetic: at the real decoder size fp32 itself is ~89 dB from it), for the state outputs the eager
chunk graph. Two components share the module: ``code2wav_first`` (1 frame, the
first chunk of the serving schedule) and ``code2wav`` (25 frames, every later chunk).

The exported graph has SnakeBeta's sin^2 written as t*t (``forms.snake_square_as_mul``) and every causal
transposed conv as a polyphase ordinary conv (``graph_forms.trans_conv_as_polyphase``): the same function in fp32, and
the forms HTP fp16 computes correctly (as written, the 25-frame chunk's audio measured 6.6 dB on the HTP simulator
in fp16: the last upsampler's ConvTranspose, 48006 outputs, came out wrong; with the rewrite 30+ dB). Its causal
convs concatenate the carried tail instead of padding, which is also the HTP-safe form of a wide padded conv. The
ConvNeXt LayerNorm is written with rms_norm (``graph_forms.layer_norm_as_rms``): the QNN HTP EP refuses a w8a16
LayerNormalization node. The residual units' dilated convs (k7, dilation 3 and 9) are written as im2col plus one
1x1 conv (``graph_forms.dilated_conv_as_im2col``): in W16A16 the HTP computes a conv spanning more than 8 samples at
~41 dB against ORT CPU, which took the w8a16 audio to 9 dB on the HTP simulator; the 1x1 form runs at 68-74 dB."""
from __future__ import annotations

import re
from typing import Iterator

import numpy as np
import torch.nn as nn

from ...components.base import FLOOR, Component, Graph, Runner, Sequence, TensorSpec
from ...blocks.graph_forms import (Int8HiLo, dilated_conv_as_im2col, layer_norm_as_rms, linear_to_conv, split_int8_hi_lo,
                            trans_conv_as_polyphase)
from .forms import snake_square_as_mul, target_form
from .host import host_for
from ...schemes import QdqPolicy


# Quantization policy for calibrated w8a16 (``qdq_policy``), from the per-stage and per-layer breakdown of the tiny
# preset's QDQ chunk graphs against fp32 on ORT CPU (tests/families/qwen3_tts/test_qwen3_tts_code2wav_quant.py):
# - RANGE_MARGIN: the calibration set (64 one-chunk samples of 5 short prompts) does not cover the ranges the chunk
#   graph meets on other text: the pre-conv output of 4 of 78 parity chunks exceeded its calibrated range by up to
#   16 %, was clipped, and those chunks fell to 20-35 dB from the first conv on. Every calibrated activation range is
#   widened 2x away from zero: 6 dB off a 16-bit floor near 90 dB, while a clipped value costs unbounded error.
# - WAVEFORM_PATH: int8 per-channel weights are 43-46 dB per layer here, but SnakeBeta (x + sin^2(a x)/b on
#   activations reaching +-37) passes errors with gain up to 2 while the signal passes with gain ~1, so the
#   error of a conv on the waveform path grows 7-15 dB by the output: one such layer at int8 alone (all else fp32)
#   measured 27-38 dB of waveform SNR, and all of them together 18.8 dB. Convs inside residual branches scaled by
#   LayerScale / ConvNeXt gamma (the transformer layers, the ConvNeXt blocks) stay at 54-86 dB each and keep int8.
#   The waveform-path convs get ~15-bit weights: each is split into an int8-grid part and its int8 residual
#   (``graph_for``, ``graph_forms.Int8HiLo``). int16 weights (W16A16) did the same on ORT CPU (34-35 dB) but the HTP
#   runs W16A16 convs at 58-67 dB per conv against CPU (W8A16 exactly), which left its audio at 23 dB; the
#   hi/lo pairs measured 32.4-32.7 dB there.
RANGE_MARGIN = 2.0
WAVEFORM_PATH = re.compile(r"dec\.(pre_conv|pre_transformer\.(input|output)_proj|upsample\.\d+\.0|decoder)\.")


class Code2WavComponent(Component):
    kind = "audio"
    reference_note = ("audio: the full (non-streaming) decode in fp64, exact arithmetic, with the eager fp32 stream's "
                      "own SNR beside it (eager_fp32_snr_db); state outputs: the eager PyTorch fp32 chunk graph")

    def __init__(self, bundle, context: int, frames: int, simulator_chunks: int | None = None):
        """``simulator_chunks``: at most this many chunk calls on a bounded (simulator) runtime, which caps the
        recipe's ``simulator_steps`` for this component: a 25-frame chunk costs minutes on the HTP simulator."""
        if simulator_chunks is not None and simulator_chunks < 1:
            raise ValueError(f"simulator_chunks must be >= 1, got {simulator_chunks}")
        self.cfg, self.frames, self.simulator_chunks = bundle.config, frames, simulator_chunks
        self.name = "code2wav_first" if frames == 1 else "code2wav"
        self.host = host_for(bundle, context)
        self.reference_graph = self.host.chunk_graphs[frames]
        self.module = dilated_conv_as_im2col(layer_norm_as_rms(trans_conv_as_polyphase(
            snake_square_as_mul(self.reference_graph)))).eval()

    def input_specs(self) -> list[TensorSpec]:
        c, n = self.cfg.decoder, self.frames
        W = c.sliding_window - 1
        kv = (1, c.num_key_value_heads, W, c.head_dim)
        specs = [TensorSpec("latents", (1, c.codebook_dim, n)), TensorSpec("cos", (1, 1, n, c.head_dim)),
                 TensorSpec("sin", (1, 1, n, c.head_dim)), TensorSpec("mask", (1, 1, n, W + n))]
        specs += [TensorSpec(f"{k}_cache_{i}", kv) for i in range(c.num_hidden_layers) for k in "kv"]
        specs += [TensorSpec(f"tail_{j}", (1, ch, L)) for j, (ch, L) in enumerate(self.reference_graph.tail_specs())]
        return specs

    def output_specs(self) -> list[TensorSpec]:
        c, n = self.cfg.decoder, self.frames
        row = (1, c.num_key_value_heads, n, c.head_dim)
        specs = [TensorSpec("audio", (1, 1, n * c.samples_per_frame))]
        specs += [TensorSpec(f"{k}_new_{i}", row) for i in range(c.num_hidden_layers) for k in "kv"]
        specs += [TensorSpec(f"tail_new_{j}", (1, ch, L)) for j, (ch, L) in enumerate(self.reference_graph.tail_specs())]
        return specs

    def describe(self) -> dict:
        return {"name": self.name, "frames": self.frames, "sliding_window": self.cfg.decoder.sliding_window,
                "simulator_chunks": self.simulator_chunks,
                "inputs": [[s.name, list(s.shape)] for s in self.input_specs()],
                "outputs": [[s.name, list(s.shape)] for s in self.output_specs()],
                "rewrites": ["snake_square_as_mul", "trans_conv_as_polyphase", "layer_norm_as_rms",
                             "dilated_conv_as_im2col"],
                "reference": self.reference_note,
                "w8a16_policy": {"activation_range_margin": RANGE_MARGIN, "int8_hi_lo": WAVEFORM_PATH.pattern},
                "host": "16 folded codebook gathers summed, RoPE tables and sliding-window masks in fp32; the last "
                        "W-1 K/V rows kept per layer; conv tails carried"}

    def stages(self) -> list[tuple[str, str]]:
        """(label, module path) of the chunk graph's stages in execution order, for ``sensitivity.stage_snr``; the
        last stage (final conv and clamp) hands on ``audio``."""
        c = self.cfg.decoder
        out = [("pre-conv", "dec.pre_conv."), ("transformer", "dec.pre_transformer.")]
        for i in range(len(c.upsampling_ratios)):
            out += [(f"upsampler {i} trans-conv", f"dec.upsample.{i}.0."), (f"upsampler {i} ConvNeXt", f"dec.upsample.{i}.1.")]
        out.append(("decoder conv", "dec.decoder.0."))
        n = len(c.upsample_rates)
        out += [(f"decoder block {i}", f"dec.decoder.{i}.") for i in range(1, n + 1)]
        return out + [("final SnakeBeta", f"dec.decoder.{n + 1}."), ("final conv + clamp", f"dec.decoder.{n + 2}.")]

    @staticmethod
    def _w8a16_family(scheme) -> bool:
        return scheme.weights == "int8" and scheme.activations == "uint16" and not scheme.mixed

    def graph_for(self, target: str, graph: Graph, scheme) -> nn.Module | None:
        """QDQ w8a16-family builds: projections as 1x1 convs, then every waveform-path conv split into an int8-grid
        part and its residual (``graph_forms.split_int8_hi_lo``), both int8: ~15-bit weights that the HTP computes
        exactly, where it runs int16 (W16A16) convs at 58-67 dB. Other targets: the family's forms (``forms``)."""
        if target != "qdq_onnx":
            return target_form(target, graph.module)
        if not self._w8a16_family(scheme):
            return None
        return split_int8_hi_lo(linear_to_conv(graph.module), lambda n: WAVEFORM_PATH.match(n + ".") is not None)

    def qdq_policy(self, graph_name: str, module: nn.Module, scheme) -> QdqPolicy | None:
        """w8a16-family builds (int8 weights, 16-bit activations, not mixed): record the int8 hi/lo pairs of
        ``module`` (the graph as exported, ``graph_for``), and for calibrated min-max ranges widen the activation
        ranges ``RANGE_MARGIN``x. ``None`` (the scheme as is) for every other scheme. Uncalibrated w8a16 gets the same
        pairs, so calibrated vs uncalibrated differs only in the activation ranges."""
        if not self._w8a16_family(scheme):
            return None
        margin = RANGE_MARGIN if scheme.calibrated and scheme.range_method == "minmax" else 1.0
        pairs = sorted(n for n, m in module.named_modules() if isinstance(m, Int8HiLo))
        return QdqPolicy("code2wav w8a16", range_margin=margin, why={
            "activation_range_margin": margin,
            "why_margin": "the calibration chunks do not cover every range the chunk graph meets (pre-conv output "
                          "clipped on held-out text); 2x costs 6 dB of the ~90 dB 16-bit floor",
            "int8_hi_lo": pairs,
            "why_waveform_precision": "convs on the waveform path (pre-conv, transformer in/out projections, upsampler "
                                      "transposed convs, vocoder decoder): SnakeBeta grows their int8 weight error 7-15 "
                                      "dB by the waveform; they get ~15-bit weights as int8 hi/lo pairs (the HTP runs "
                                      "W8A16 exactly, W16A16 at 58-67 dB); LayerScale/gamma-scaled residual branches "
                                      "keep int8"})

    def _padded(self, codes: np.ndarray) -> np.ndarray:
        n = self.frames
        pad = (-codes.shape[0]) % n
        return np.concatenate((codes, np.zeros((pad, codes.shape[1]), np.int64))) if pad else codes

    def _stack(self, outs):
        names = [s.name for s in self.output_specs()]
        return {k: np.concatenate([o[i] for o in outs]) for i, k in enumerate(names)}

    def _codes(self, prompts, opts):
        for p in prompts.prompts:
            yield self._padded(self.host.generate(p, opts["max_prompt_tokens"], opts["new_tokens"]).codes)

    def _sched(self, codes):
        return [self.frames] * (codes.shape[0] // self.frames)

    def reference(self, prompts, opts) -> list[Sequence]:
        out = []
        for codes in self._codes(prompts, opts):
            _, outs = self.host.stream({self.frames: self.eager_runner(self.reference_graph)}, codes, self._sched(codes))
            seq = self._stack(outs)
            # The target is exact arithmetic: the full decode in fp64. The eager fp32 stream beside it gives the floor
            # fp32 itself reaches on this config (reported as ``eager_fp32_snr_db``).
            seq[f"{FLOOR}audio"] = seq["audio"]
            seq["audio"] = self.host.exact_decode(codes).reshape(seq["audio"].shape)
            seq["in.codes"] = codes
            out.append(Sequence([], 0, seq))
        return out

    def calibration_steps(self, prompts, opts) -> int:
        return sum(len(self._sched(c)) for c in self._codes(prompts, opts))

    def calibration_feeds(self, prompts, opts) -> Iterator[dict[str, np.ndarray]]:
        for codes in self._codes(prompts, opts):
            feeds = []
            self.host.stream({self.frames: self.eager_runner(self.reference_graph)}, codes, self._sched(codes),
                             record=lambda f: feeds.append({k: v.copy() for k, v in f.items()}))
            yield from feeds

    def trace(self, run: Runner, reference: list[Sequence], max_steps: int | None) -> list[Sequence]:
        if max_steps is not None and self.simulator_chunks is not None:
            max_steps = min(max_steps, self.simulator_chunks)
        budget, out = max_steps, []
        for ref in reference:
            if budget is not None and budget <= 0:
                break
            codes = ref.outputs["in.codes"]
            _, outs = self.host.stream({self.frames: run}, codes, self._sched(codes), max_steps=budget)
            budget = None if budget is None else budget - len(outs)
            out.append(Sequence([], 0, self._stack(outs)))
        return out
