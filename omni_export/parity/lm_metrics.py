"""Language-model statistics that say whether an artifact is still "the same model" as the fp32 reference.

They follow llama.cpp's ``llama-perplexity --kl-divergence`` (tools/perplexity/README.md in llama.cpp): a first run
with ``--kl-divergence-base`` stores the full-precision model's log-probabilities over the whole vocabulary at every
evaluated position; a second run of the quantized model over the same tokens reports

- the KL divergence KL(p_base || p_quant) per position, summarised as mean, percentiles (99.0 % among them) and max;
- "Same top p": the share of positions where the quantized model's most likely token is the base model's;
- the perplexity of each model on the text's actual next tokens, and ln(PPL(Q)/PPL(base)).

Here the base is the fp32 model and the quantized model is the artifact; ``targets`` are held-out next tokens
(distinct from the calibration text). llama.cpp scores only the second half of each context window (the first half
is context); pass ``mask`` to score a subset the same way. Everything is computed in float64 with a max-shifted
log-softmax, so large logits neither overflow nor lose the small probabilities KL divergence lives on. Percentiles
use numpy's linear interpolation. ``greedy_agreement`` is the free-running complement: how many generated tokens two
greedy decodes share before the first divergence.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..errors import BadInput


# positions per step of the KL and perplexity sums: a vocabulary of 262,144 (Gemma 3) in float64 is 2 MB a position,
# and the whole parity set at once held 2.8 GB of temporaries (``python -m memray run`` of the Gemma 3 CI recipe)
CHUNK_ROWS = 32


def log_softmax(logits) -> np.ndarray:
    """float64 log-probabilities over the last axis (max-shifted; -inf logits stay -inf)."""
    x = np.asarray(logits, dtype=np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    if not np.all(np.isfinite(m)):
        raise BadInput("logits contain NaN or a position with no finite logit")
    z = x - m
    return z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))


def _flat(a, name: str) -> np.ndarray:
    a = np.asarray(a)
    if a.ndim < 2:
        raise BadInput(f"{name} must be [..., vocab], got shape {a.shape}")
    return a.reshape(-1, a.shape[-1])


def _pair(ref_logits, logits, mask=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ref, out = _flat(ref_logits, "fp32 logits"), _flat(logits, "artifact logits")
    if ref.shape != out.shape:
        raise BadInput(f"fp32 logits {np.shape(ref_logits)} and artifact logits {np.shape(logits)} differ in shape")
    keep = np.ones(len(ref), bool) if mask is None else np.asarray(mask, bool).reshape(-1)
    if keep.shape != (len(ref),):
        raise BadInput(f"mask has {keep.size} entries for {len(ref)} positions")
    if not keep.any():
        raise BadInput("no position to score (empty logits or an all-false mask)")
    if keep.all():  # every position: the arrays themselves, not copies (two more vocabulary-wide arrays at Gemma 3)
        return ref, out, keep
    return ref[keep], out[keep], keep


def _row_chunks(n: int):
    """Slices of ``CHUNK_ROWS`` positions covering ``n`` (one empty slice for none)."""
    return [slice(i, i + CHUNK_ROWS) for i in range(0, n, CHUNK_ROWS)] or [slice(0, 0)]


def kl_divergence(ref_logits, logits) -> np.ndarray:
    """KL(p_ref || p) in nats at every position (flattened leading axes), float64, >= 0; ``CHUNK_ROWS`` positions
    at a time (every step is per position, so the values are those of one pass over all of them)."""
    ref, out = _flat(ref_logits, "fp32 logits"), _flat(logits, "artifact logits")
    if ref.shape != out.shape:
        raise BadInput(f"fp32 logits {ref.shape} and artifact logits {out.shape} differ in shape")

    def rows(r: slice) -> np.ndarray:
        lp, lq = log_softmax(ref[r]), log_softmax(out[r])
        p = np.exp(lp)
        with np.errstate(invalid="ignore"):
            terms = np.where(p > 0, p * (lp - lq), 0.0)
        return np.maximum(terms.sum(axis=-1), 0.0)
    return np.concatenate([rows(r) for r in _row_chunks(len(ref))])


def same_top_p(ref_logits, logits, mask=None) -> float:
    """Share of positions whose argmax token agrees (llama.cpp's "Same top p", as a fraction)."""
    ref, out, _ = _pair(ref_logits, logits, mask)
    return float(np.mean(np.argmax(ref, axis=-1) == np.argmax(out, axis=-1)))


def perplexity(logits, targets, mask=None) -> float:
    """exp of the mean negative log-likelihood of ``targets`` (the next token at each position)."""
    lp = _flat(logits, "logits")
    t = np.asarray(targets).reshape(-1)
    if t.shape != (len(lp),):
        raise BadInput(f"{t.size} targets for {len(lp)} positions")
    if t.size and (t.min() < 0 or t.max() >= lp.shape[-1]):
        raise BadInput(f"target ids must lie in [0, {lp.shape[-1]}), got {t.min()}..{t.max()}")
    keep = np.ones(len(lp), bool) if mask is None else np.asarray(mask, bool).reshape(-1)
    if keep.shape != (len(lp),) or not keep.any():
        raise BadInput("mask must select at least one of the positions")
    kept, tk = (lp, t) if keep.all() else (lp[keep], t[keep])  # every position: no copy, as in ``_pair``
    ll = np.concatenate([log_softmax(kept[r])[np.arange(len(tk[r])), tk[r]] for r in _row_chunks(len(kept))])
    return float(np.exp(-np.mean(ll)))


def greedy_agreement(ref_ids, ids) -> int:
    """Number of tokens two greedy decodes share before the first divergence (the shorter length if none)."""
    a, b = [int(i) for i in ref_ids], [int(i) for i in ids]
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@dataclass(frozen=True)
class LMStats:
    positions: int
    kld_mean: float
    kld_p99: float
    kld_max: float
    same_top_p: float
    ppl_fp32: float | None = None
    ppl: float | None = None
    delta_ppl: float | None = None      # artifact - fp32
    ppl_ratio: float | None = None      # artifact / fp32 (llama.cpp prints ln of it)

    def to_dict(self) -> dict:
        return asdict(self)


def lm_stats(ref_logits, logits, targets=None, mask=None) -> LMStats:
    """All teacher-forced statistics of an artifact against the fp32 reference on the same input tokens.

    ``ref_logits``/``logits``: [..., vocab] at the same positions; ``targets``: the held-out next token at each
    position (perplexities are left None without them); ``mask``: the positions to score (default all)."""
    ref, out, keep = _pair(ref_logits, logits, mask)
    kld = kl_divergence(ref, out)
    ppl_ref = ppl = delta = ratio = None
    if targets is not None:
        t = np.asarray(targets).reshape(-1)
        if t.shape != keep.shape:
            raise BadInput(f"{t.size} targets for {keep.size} positions")
        ppl_ref, ppl = perplexity(ref, t[keep]), perplexity(out, t[keep])
        delta, ratio = ppl - ppl_ref, ppl / ppl_ref
    return LMStats(positions=int(len(kld)), kld_mean=float(np.mean(kld)), kld_p99=float(np.percentile(kld, 99)),
                   kld_max=float(np.max(kld)), same_top_p=float(np.mean(np.argmax(ref, -1) == np.argmax(out, -1))),
                   ppl_fp32=ppl_ref, ppl=ppl, delta_ppl=delta, ppl_ratio=ratio)
