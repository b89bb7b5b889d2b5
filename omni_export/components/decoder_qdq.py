"""The QDQ policy of the decoder-LM components (decode step and prefill, every family on ``decoder_lm``) for the
shipped ``w8a16``: what trained weights need (``docs/parity.md``, "w8a16 on trained weights").

- Projections: int8 symmetric per channel, except ``down_proj`` and ``v_proj`` of every layer (a fused
  ``q_k_v_proj`` carries v, so it is raised whole) and the LM head: int16 per channel (they carry most of the
  weight-only KLD: down, then v, then the head). Each int8 channel's scale is searched on the calibration set's
  inputs to its projection (``quantize.scale_search``, SeqMSE-style: of 1.0 to 0.5 x min-max, the one with the
  least output error). SmolLM2's decode step on CPU-QDQ, 338 held-out positions: min-max scales 33.9 dB, K/V
  31.4, KLD 1.19e-3; searched 34.9 dB, 31.9, 1.06e-3, with 19 % of the int8 channels clipped (the prefill keeps
  32.0 dB with 7 % less KLD; docs/parity.md).
- Activations uint16, K/V rows int16 symmetric; each layer's cache input and new-row output share one encoding (a host that
  stores quantized rows reads them with the same scale they were written with).
- Decode step only: every calibrated activation range widened by ``RANGE_MARGIN`` away from zero: min-max over the
  calibration text clips the few held-out tokens whose activations lie beyond it (SmolLM2's decode step on CPU-QDQ, 333 held-out
  positions: as calibrated 25.7 dB, KLD 9.6e-3 / p99 0.10, single positions at 3.6 dB; widened 1.5x 34.0 dB,
  KLD 1.15e-3 / p99 9.5e-3; 2x 34.2 dB, 1.16e-3 / 7.0e-3; 3x 33.1 dB, 1.38e-3 / 7.3e-3, where the lost
  resolution starts to show: ``docs/parity.md``). 2x costs one of the 16 activation bits. Not in the prefill: its
  30 calibration calls cover every prompt row, and widened it fell from 32.1 to 29.5 dB on CPU-QDQ. (K/V rows are
  int16 symmetric by the target's own rule for MatMul inputs, ``quantize.policy.matmul_rhs_groups``: on the
  HTP simulator that took this decode step from 23.5 to 34.2 dB.)
- Prefill only (row 0, the attention sink, is in every prefill call: its residual channel reaches ~25,800 on
  SmolLM2 while every other row stays under ~935): the residual Adds and RMSNorms stay float (fp16 islands on
  the HTP), and so does the ``down_proj`` of each layer that carries the sink, found from this build's own
  calibration ranges (input absmax above ``SINK_FACTOR`` x the median layer's) and recorded with the ranges.
The exporter resolves the patterns against the graph it quantizes (``quantize.policy``).
"""
from __future__ import annotations

from dataclasses import replace

from ..schemes import FloatOutliers, QdqPolicy

INT16_WEIGHTS = r"(down_proj|v_proj|lm_head)\.conv\.weight$"
SINK_FACTOR = 10.0
RANGE_MARGIN = 2.0
WHY = {"weights": "int8 symmetric per channel; int16 per channel for down_proj, v_proj (a fused q_k_v_proj whole) and "
                  "the LM head",
       "activations": "uint16; K/V rows int16 symmetric (the target's MatMul rule); a layer's cache input and new row "
                      "share one encoding",
       "norm": "fused RMSNorm (SimplifiedLayerNormalization)",
       "weight_scales": "int8 per-channel scales searched against the calibration inputs (least output error, 1.0 to "
                        "0.5 x min-max)"}


def takes_decoder_policy(scheme) -> bool:
    """The schemes this policy is for: calibrated min-max int8 per-channel weights with uint16 activations on the
    fused norm, sinks left out of calibration (``w8a16`` and ``w8a16_mixed``, which raises weights on top of it).
    The sweep's other w8a16 variants (percentile, entropy, uncalibrated, naive) are measured as their scheme says."""
    return (scheme.weights == "int8" and scheme.activations == "uint16" and scheme.per_channel and scheme.calibrated
            and scheme.range_method == "minmax" and scheme.fused_norm and not scheme.calibrate_sinks)


def decoder_qdq_policy(scheme, prefill: bool) -> QdqPolicy | None:
    if not takes_decoder_policy(scheme):
        return None
    common = dict(int16_weight_match=INT16_WEIGHTS, shared_kv=True, weight_scales="mse")
    if not prefill:
        return QdqPolicy("decoder w8a16: decode step", range_margin=RANGE_MARGIN, **common, why={
            **WHY, "activation_range_margin": f"every calibrated range widened {RANGE_MARGIN:g}x away from zero "
                                              "(held-out activations beyond the calibration text's min-max are not "
                                              "clipped)"})
    return QdqPolicy("decoder w8a16: prefill", float_ops=("rmsnorm", "residual_add"),
                     float_outliers=FloatOutliers(r"down_proj\.conv\.weight$", SINK_FACTOR), **common, why={
                         **WHY, "fp16_islands": "residual Adds and RMSNorms float (fp16 on the HTP), and down_proj of "
                                                "the layers carrying the attention sink of row 0"})


def step_qdq_policy(comp, graph_name: str, module, scheme) -> QdqPolicy | None:
    """``DecodeStepComponent.qdq_policy``."""
    return decoder_qdq_policy(scheme, prefill=False)


def prefill_qdq_policy(comp, graph_name: str, module, scheme) -> QdqPolicy | None:
    """``PrefillComponent.qdq_policy``: row 0's sink is in every call, so fp16 islands."""
    return decoder_qdq_policy(scheme, prefill=True)


GENIE_FLOAT_OPS = ("rmsnorm", "residual_add")
GENIE_FLOAT_WHY = ("residual Adds and RMSNorms float (fp16 on the HTP) in both Genie programs: the prompt processor "
                   "computes position 0, whose residual channel reaches ~25,800 on SmolLM2 (every other row under "
                   "~935), and a float RMSNorm keeps its weight unquantized, so the token generator floats the same "
                   "ops (one set of weight encodings)")


def genie_token_qdq_policy(scheme) -> QdqPolicy | None:
    """The Genie token generator's (AR-1) policy: the decode step's (int16 down/v/head, searched int8 scales, ranges
    widened ``RANGE_MARGIN``x) with the residual Adds and RMSNorms float, as in the prompt processor
    (``genie_prompt_qdq_policy``): a float RMSNorm's weight stays unquantized, and both programs carry one set of
    weight encodings."""
    policy = decoder_qdq_policy(scheme, prefill=False)
    if policy is None:
        return None
    return replace(policy, name="decoder w8a16: Genie token generator", float_ops=GENIE_FLOAT_OPS,
                   why={**policy.why, "fp16_islands": GENIE_FLOAT_WHY})


def genie_prompt_qdq_policy(scheme) -> QdqPolicy | None:
    """The Genie prompt processor's (AR-N) policy: the token generator's weights (int16 down/v/head, the int8 scales
    it searched: one set of weight encodings for both programs) and float residual Adds and RMSNorms, activations
    calibrated on Genie's own prompt calls, row 0 (the attention sink) included, as calibrated (no range margin:
    every prompt row is in the calibration, as for the prefill). What the float islands measured on SmolLM2:
    docs/deploy.md, "What a bundle holds"."""
    policy = genie_token_qdq_policy(scheme)
    if policy is None:
        return None
    why = {k: v for k, v in policy.why.items() if k != "activation_range_margin"}
    why["activation_ranges"] = ("Genie's prompt calls over the calibration prompts, position 0 (the attention sink) "
                                "included, as calibrated (no margin)")
    return replace(policy, name="decoder w8a16: Genie prompt processor", range_margin=1.0, why=why)


GENAI_FLOAT_WHY = ("residual Adds and RMSNorms float (fp32 on the CPU EP), and the down_proj of each layer carrying "
                   "the attention sink with the product feeding it and its output's layout: GenAI's prompt call "
                   "computes position 0 in the graph of every generated token, and the sink row's range there "
                   "(SmolLM2's layer 11: input ~3,100 and output ~25,100 against ~10 and ~18 at every other row) "
                   "would set the step for every other row")


def genai_qdq_policy(scheme) -> QdqPolicy | None:
    """The ``onnx_genai`` w8a16 bundle's policy (``quantize.genai_qdq``): one graph takes GenAI's prompt call (row 0,
    the attention sink, included) and every generated token, so it is the prefill's policy (int16 down/v/head,
    searched int8 scales, residual Adds and RMSNorms float, the down_proj of each layer carrying the sink float)
    with that down_proj's input product and output layout float too (``FloatOutliers.with_input``), calibrated on
    GenAI's own calls over the calibration prompts, every range widened ``RANGE_MARGIN`` x as in the decode step
    (SmolLM2, 333 held-out positions: as calibrated 29.4 dB, KLD 4.3e-3; widened 2x 34.8 dB, 1.0e-3:
    docs/deploy.md)."""
    policy = decoder_qdq_policy(scheme, prefill=True)
    if policy is None:
        return None
    why = {**policy.why, "fp16_islands": GENAI_FLOAT_WHY,
           "activation_ranges": "GenAI's calls over the calibration prompts (each prompt in one call, position 0 "
                                f"included; then one call per greedy token), every range widened {RANGE_MARGIN:g}x "
                                "away from zero (held-out tokens' activations beyond the calibration text's min-max "
                                "are not clipped)"}
    return replace(policy, name="decoder w8a16: GenAI decoder", why=why, range_margin=RANGE_MARGIN,
                   float_outliers=replace(policy.float_outliers, with_input=True))
