"""Named quantization schemes. A scheme is data; exporters interpret it.

Recipes reference schemes by name; the manifest records the whole scheme, never a name inferred from a path.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from .errors import RecipeError


@dataclass(frozen=True)
class Scheme:
    name: str
    weights: str            # fp32 | fp16 | int8 | int4
    activations: str        # fp32 | fp16 | uint16 | uint8
    per_channel: bool = False
    calibrated: bool = True  # False: activation ranges from random stand-in inputs (what uncalibrated builds do)
    range_method: str = "minmax"  # minmax | percentile | entropy (ORT CalibrationMethod)
    mixed: bool = False      # raise the most sensitive weights to 16 bits until the gate's thresholds hold
    fused_norm: bool = True  # False: the exporter's decomposed RMSNorm is quantized op by op (the naive build)
    calibrate_sinks: bool = False  # True: attention-sink tokens stay in the calibration set (the naive build)
    note: str = ""

    @property
    def quantized(self) -> bool:
        return self.weights in ("int8", "int4")

    def to_dict(self) -> dict:
        return asdict(self)


SCHEMES: dict[str, Scheme] = {s.name: s for s in (
    Scheme("fp32", "fp32", "fp32", note="reference precision"),
    Scheme("fp16", "fp16", "fp16", note="HTP fp16 precision / half-precision graph"),
    Scheme("w8a16", "int8", "uint16", per_channel=True,
           note="int8 per-channel weights, 16-bit activations, ranges from captured fp32 activations"),
    Scheme("w4a16_uncalibrated", "int4", "uint16", per_channel=True, calibrated=False,
           note="int4 weights with ranges from random inputs: the build people quote, expected to be blocked"),
    Scheme("w8a16_naive", "int8", "uint16", per_channel=True, fused_norm=False, calibrate_sinks=True,
           note="w8a16 the obvious way, expected to be blocked on trained weights: every op quantized including "
                "the decomposed RMSNorm, ORT's QNN defaults (int8 per-channel weights everywhere, no int16 or fp16 "
                "islands), ranges calibrated with the attention-sink tokens in"),
    Scheme("w8a8", "int8", "uint8", per_channel=True,
           note="int8 activations: breaks every model family studied, expected to be blocked"),
    Scheme("w8a16_percentile", "int8", "uint16", per_channel=True, range_method="percentile",
           note="w8a16 with activation ranges clipped at the 99.999th percentile of the calibration set"),
    Scheme("w8a16_entropy", "int8", "uint16", per_channel=True, range_method="entropy",
           note="w8a16 with activation ranges chosen by ORT's entropy (KL) calibration"),
    Scheme("w8a16_uncalibrated", "int8", "uint16", per_channel=True, calibrated=False,
           note="w8a16 with activation ranges from random inputs: the calibrated-vs-uncalibrated comparison"),
    Scheme("w4a16", "int4", "uint16", per_channel=True,
           note="int4 per-channel weights (Conv), 16-bit activations, ranges from the calibration set"),
    Scheme("w8a16_mixed", "int8", "uint16", per_channel=True, mixed=True,
           note="w8a16, with the weights most sensitive on the calibration set raised to int16 until every gated "
                "output clears its thresholds there; the chosen overrides are recorded"),
    Scheme("w8a8_dynamic", "int8", "int8_dynamic", per_channel=True, calibrated=False,
           note="int8 per-channel weights, int8 activations quantized per call at runtime (XNNPACK dynamic "
                "quantization): no activation ranges, so no calibration set"),
    Scheme("w4a8_dynamic", "int4", "int8_dynamic", per_channel=True, calibrated=False,
           note="ExecuTorch 8da4w: int4 weights in groups of 32 (torchao Int8DynamicActivationIntxWeightConfig), "
                "int8 activations quantized per call by XNNPACK; no activation ranges, so no calibration set"),
    Scheme("int8_weight_only_torchao", "int8", "fp32", per_channel=True, calibrated=False,
           note="torchao Int8WeightOnlyConfig lowered to XNNPACK: exports successfully but computes wrong numbers "
                "(measured: logits far below 0 dB on a 2-layer model; the scale is dropped); expected to be blocked"),
    Scheme("w8_fp16", "int8", "fp16", per_channel=True, calibrated=False,
           note="int8 per-channel symmetric weights (weight-only), fp16 compute: no activation ranges"),
)}


def get_scheme(name: str) -> Scheme:
    try:
        return SCHEMES[name]
    except KeyError:
        raise RecipeError(f"unknown scheme {name!r}; known: {', '.join(SCHEMES)}") from None
