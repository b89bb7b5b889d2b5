"""One registration per parity metric: what the gate judges, how ``compare`` computes it, which way is better, how
far the CI gate lets it drift from a baseline, and which on-device measuring modes cannot produce it.

Everything that names a metric reads this table: the gate (``parity.gate``: thresholds, positions, device modes),
``parity.metrics.compare`` (per-output and teacher-forced LM figures), the CI gate's tolerances
(``audit.ci_gate.Tolerances``), the store audit's figure checks (``audit.gate_store``), re-execution
(``reexecute``) and the AI Hub verdicts (``hub.judging``). A new metric is one ``register(MetricSpec(...))``:

- ``kind="output"`` with ``compute(ref, test) -> float``: measured on every output of every component, over the
  steps compared (``compare``'s per-output figures).
- ``kind="lm"`` with ``compute(ref_logits, test_logits) -> float``: measured over an LM head's teacher-forced
  positions from ``FIRST_POSITION`` on (both arrays [positions, vocab]), counted in ``kld_positions``. The
  built-in LM figures (top-1, greedy runs, llama.cpp's KL statistics, perplexity) are computed together by
  ``metrics.lm_figures`` and registered here without ``compute``.
- ``kind="audio"``: computed over a component's whole waveform (``log_mel_distance``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import RecipeError

KINDS = ("output", "lm", "audio")
TOLERANCES = ("db", "agreement", "ratio")  # ``audit.ci_gate.Tolerances``' three fields
# What each on-device measuring mode (``hub.payload``: the parity inputs sent as one inference dataset) cannot
# produce, and why. ``free_running`` metrics need the host's free-running loop; ``per-call`` measures no token or
# audio figure at all.
FREE_RUNNING_REASON = ("free-running greedy generation needs one inference job per token; on the device only "
                       "teacher-forced steps are measured, so this metric stays gated by the local runtime")
PER_CALL_REASON = ("the device runs the recorded graph calls one by one; token metrics need the host loop's "
                   "positions, so this metric stays gated by the local runtime")


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: str                       # one of KINDS
    lower_is_better: bool = False   # a regression is a rise (errors, divergences) or a fall (SNR, agreement)
    tolerance: str = "agreement"    # how the CI gate's baseline comparison widens it (one of TOLERANCES)
    positions: str | None = None    # LM metrics: the figure counting the positions it was measured on
    free_running: bool = False      # measured on free-running generation only (not on teacher-forced steps)
    compute: Callable[[np.ndarray, np.ndarray], float] | None = None
    digits: int | None = None       # rounding of a computed figure in the report (None: as computed)
    about: str = ""                 # one line: what it measures

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"metric {self.name}: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.tolerance not in TOLERANCES:
            raise ValueError(f"metric {self.name}: tolerance {self.tolerance!r} is not one of {', '.join(TOLERANCES)}")
        if self.kind == "output" and self.compute is None:
            raise ValueError(f"metric {self.name}: an output metric needs compute(ref, test)")
        if not self.about.strip():
            raise ValueError(f"metric {self.name}: say in `about` what it measures")

    def measure(self, ref: np.ndarray, test: np.ndarray) -> float:
        v = float(self.compute(ref, test))
        return round(v, self.digits) if self.digits is not None and math.isfinite(v) else v

    def unmeasurable_in(self, mode: str) -> str | None:
        """Why the on-device ``mode`` cannot measure this metric (None: it can)."""
        if mode == "per-call" and self.kind in ("lm", "audio"):
            return PER_CALL_REASON
        if mode == "teacher-forced" and self.free_running:
            return FREE_RUNNING_REASON
        return None


METRICS: dict[str, MetricSpec] = {}


def register(spec: MetricSpec) -> MetricSpec:
    """Add ``spec`` to the table (a name registered twice is an error, not a silent replacement)."""
    if spec.name in METRICS:
        raise RecipeError(f"metric {spec.name!r} is already registered")
    METRICS[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove a metric (tests that register a toy metric put the table back)."""
    METRICS.pop(name)


def metric(name: str) -> MetricSpec:
    """The registered metric, or a one-line error naming the known ones."""
    try:
        return METRICS[name]
    except KeyError:
        raise RecipeError(f"threshold metric {name!r} unknown; known: {', '.join(METRICS)}") from None


def names(kind: str | None = None) -> tuple[str, ...]:
    return tuple(n for n, s in METRICS.items() if kind is None or s.kind == kind)


SNR_CAP = 300.0  # identical tensors: reported as 300 dB rather than infinity (JSON has no infinity)


# elements per step of a large SNR's sums (32 MB in float64): Gemma 3's logits over its parity positions in one step
# held 1.2 GB of float64 temporaries (``python -m memray run`` of its CI recipe); an array this size or smaller is
# summed in one step, as before
SNR_CHUNK = 1 << 22


def snr_db(ref: np.ndarray, test: np.ndarray) -> float:
    if ref.shape == test.shape and ref.size > SNR_CHUNK:
        r, t = ref.reshape(-1), test.reshape(-1)
        err = sig = 0.0
        for i in range(0, r.size, SNR_CHUNK):
            a, b = r[i: i + SNR_CHUNK].astype(np.float64), t[i: i + SNR_CHUNK]
            if not np.all(np.isfinite(b)):
                return -SNR_CAP
            err += float(np.sum((a - b.astype(np.float64)) ** 2))
            sig += float(np.sum(a ** 2))
    else:
        ref = ref.astype(np.float64)
        err = float(np.sum((ref - test.astype(np.float64)) ** 2))
        sig = float(np.sum(ref ** 2))
        if not np.all(np.isfinite(test)):
            return -SNR_CAP
    if err == 0.0:
        return SNR_CAP
    if sig == 0.0:
        return -SNR_CAP
    return float(min(SNR_CAP, 10.0 * math.log10(sig / err)))


def _chunks(ref: np.ndarray, test: np.ndarray):
    """``(ref, test)`` flattened in slices of ``SNR_CHUNK`` elements when they are larger and of one shape, else the
    pair as it is."""
    if ref.shape != test.shape or ref.size <= SNR_CHUNK:
        yield ref, test
        return
    r, t = ref.reshape(-1), test.reshape(-1)
    for i in range(0, r.size, SNR_CHUNK):
        yield r[i: i + SNR_CHUNK], t[i: i + SNR_CHUNK]


def cosine(ref: np.ndarray, test: np.ndarray) -> float:
    """In float64, its three sums ``SNR_CHUNK`` elements at a time (Gemma 3's prefill logits in float64 at once
    were 2.5 GB)."""
    ab = aa = bb = 0.0
    for r, t in _chunks(ref, test):
        a, b = r.reshape(-1).astype(np.float64), t.reshape(-1).astype(np.float64)
        ab, aa, bb = ab + float(a @ b), aa + float(a @ a), bb + float(b @ b)
    na, nb = np.sqrt(aa), np.sqrt(bb)
    return float(ab / (na * nb)) if na > 0 and nb > 0 else 0.0


def max_abs_err(ref: np.ndarray, test: np.ndarray) -> float:
    """``SNR_CHUNK`` elements at a time (the same maximum: a NaN anywhere is the result, as in one pass)."""
    return float(np.max([np.max(np.abs(r - t)) for r, t in _chunks(ref, test)]))


# Output metrics, in the order each output's figures are written.
register(MetricSpec("snr_db", "output", tolerance="db", compute=snr_db, digits=3,
                    about="signal (reference energy) over noise (the difference) in dB, over every step compared"))
register(MetricSpec("max_abs_err", "output", lower_is_better=True, tolerance="ratio", compute=max_abs_err,
                    about="largest absolute difference from the reference"))
register(MetricSpec("cosine", "output", compute=cosine, digits=6, about="cosine similarity with the reference"))
# LM figures (``metrics.lm_figures``); the KL statistics and the perplexity ratio follow llama.cpp's
# ``llama-perplexity --kl-divergence`` (``parity/lm_metrics.py``).
for _name, _lower, _tol, _pos, _free, _about in (
        ("top1_agreement", False, "agreement", "top1_positions", False,
         "teacher-forced positions whose argmax is fp32's greedy token"),
        ("greedy_agreement", False, "agreement", "greedy_positions", True,
         "free-running greedy tokens equal to fp32's, position by position"),
        ("max_logprob_delta", True, "ratio", "top1_positions", False,
         "largest |log p| difference of fp32's greedy token"),
        ("greedy_tokens_min", False, "agreement", "greedy_positions", True,
         "the shortest agreed greedy prefix over the prompts"),
        ("kld_mean", True, "ratio", "kld_positions", False, "mean KL(fp32 || artifact) per position"),
        ("kld_p99", True, "ratio", "kld_positions", False, "99th percentile of KL(fp32 || artifact)"),
        ("kld_max", True, "ratio", "kld_positions", False, "largest KL(fp32 || artifact)"),
        ("same_top_p", False, "agreement", "kld_positions", False, "share of positions with fp32's top token"),
        ("ppl_ratio", True, "ratio", "ppl_positions", False, "PPL(artifact) / PPL(fp32) on held-out next tokens")):
    register(MetricSpec(_name, "lm", lower_is_better=_lower, tolerance=_tol, positions=_pos, free_running=_free,
                        about=_about))
register(MetricSpec("log_mel_distance", "audio", lower_is_better=True, tolerance="ratio",
                    about="mean absolute log-mel difference (dB) of the whole waveform"))
