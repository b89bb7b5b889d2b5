"""Named quantization schemes. A scheme is data; exporters interpret it.

Recipes reference schemes by name; the manifest records the whole scheme, never a name inferred from a path.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .errors import RecipeError

FLOAT_OPS = ("rmsnorm", "residual_add")
WEIGHT_SCALES = ("minmax", "mse", "shared")


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

    @property
    def half(self) -> bool:
        """fp16 weights and activations: a float build, no quantization."""
        return self.weights == "fp16" and self.activations == "fp16"

    @property
    def dynamic_activations(self) -> bool:
        """Activations quantized per call at runtime (no ranges, no calibration)."""
        return self.activations == "int8_dynamic"

    @property
    def static_activations(self) -> bool:
        """Activations quantized with fixed ranges (uint16, uint8): ranges a calibrated build takes from data."""
        return self.activations in ("uint16", "uint8")

    @property
    def weight_only(self) -> bool:
        """Quantized weights computed in float (fp32 or fp16 activations)."""
        return self.quantized and self.activations in ("fp32", "fp16")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class FloatOutliers:
    """Convs whose weight name matches ``match`` and whose calibrated input absmax exceeds ``factor`` x the median
    over the matching convs stay float (weights and op), decided from the build's own calibration ranges;
    ``with_input``: the op computing each such conv's input and the moves laying its input and output out stay
    float too, so neither the outlier input nor the outlier output is quantized."""
    match: str
    factor: float
    with_input: bool = False


@dataclass(frozen=True)
class QdqPolicy:
    """What a component's QDQ build of a scheme does beyond the scheme's defaults (int8 or int4 weights, uint16 or
    uint8 activations, every op quantized, ranges as calibrated), declared by the component
    (``Component.qdq_policy``) and recorded whole in the manifest (``to_record``). The exporter resolves the
    patterns against the graph it quantizes (``quantize.policy``); it knows no model class and no scheme name.

    - ``int16_weights`` / ``int16_weight_match``: weight names / a regex over conv weight names: int16 per channel;
    - ``weight_scales``: ``minmax`` (the quantizer's), ``mse`` (each int8 channel's scale searched on the
      calibration inputs, ``quantize.scale_search``) or ``shared`` (those of the peer program ``scales_from``);
    - ``range_margin``: every calibrated activation range widened this much away from zero (1.0: as calibrated);
    - ``float_ops``: ``rmsnorm`` (every fused RMSNorm) and/or ``residual_add`` (every Add feeding one) left float
      (fp16 on the HTP), except a node reading a graph input or writing a graph output;
    - ``float_outliers``: convs left float when their calibrated input is an outlier (``FloatOutliers``);
    - ``shared_kv``: each layer's cache input and new-row output get one encoding;
    - ``why``: the reason for each choice, by the choice's name (recorded with it)."""
    name: str
    int16_weights: tuple[str, ...] = ()
    int16_weight_match: str | None = None
    weight_scales: str = "minmax"
    scales_from: str | None = None
    range_margin: float = 1.0
    float_ops: tuple[str, ...] = ()
    float_outliers: FloatOutliers | None = None
    shared_kv: bool = False
    why: dict[str, object] = field(default_factory=dict, compare=False)

    def __post_init__(self):
        bad = sorted(set(self.float_ops) - set(FLOAT_OPS))
        if bad:
            raise ValueError(f"QdqPolicy {self.name}: unknown float_ops {bad}; known: {list(FLOAT_OPS)}")
        if self.weight_scales not in WEIGHT_SCALES:
            raise ValueError(f"QdqPolicy {self.name}: weight_scales {self.weight_scales!r}; known: {list(WEIGHT_SCALES)}")
        if (self.weight_scales == "shared") != (self.scales_from is not None):
            raise ValueError(f"QdqPolicy {self.name}: weight_scales 'shared' and scales_from go together")
        if self.range_margin < 1.0:
            raise ValueError(f"QdqPolicy {self.name}: range_margin {self.range_margin} narrows the calibrated ranges")

    @property
    def needs_ranges(self) -> bool:
        """Whether the plan decides from calibrated ranges (outliers, searched scales, shared K/V encodings)."""
        return self.float_outliers is not None or self.shared_kv or self.weight_scales == "mse"

    def to_record(self) -> dict:
        """The manifest's record: the policy's name, every setting as data, and why."""
        settings = {k: v for k, v in asdict(self).items() if k not in ("name", "why")}
        settings["int16_weights"] = list(self.int16_weights)
        settings["float_ops"] = list(self.float_ops)
        return {"policy": self.name, "settings": settings, **self.why}


SCHEMES: dict[str, Scheme] = {s.name: s for s in (
    Scheme("fp32", "fp32", "fp32", note="reference precision"),
    Scheme("fp16", "fp16", "fp16", note="HTP fp16 precision / half-precision graph"),
    Scheme("w8a16", "int8", "uint16", per_channel=True,
           note="int8 per-channel weights, 16-bit activations, ranges from captured fp32 activations; a component's "
                "QdqPolicy may raise named tensors to int16 or leave fp16 islands (each tensor's choice is in the "
                "manifest's component_policy)"),
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
    Scheme("w8_block32", "int8", "fp32", calibrated=False,
           note="int8 symmetric weights in blocks of 32 along each MatMul's reduction axis (onnxruntime MatMulNBits, "
                "weight-only), fp32 activations and compute: no activation ranges; the manifest lists every MatMul "
                "quantized and every one left fp32"),
)}


def get_scheme(name: str) -> Scheme:
    try:
        return SCHEMES[name]
    except KeyError:
        raise RecipeError(f"unknown scheme {name!r}; known: {', '.join(SCHEMES)}") from None
