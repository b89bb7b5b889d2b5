"""LM metrics against hand-computed values: KL divergence, same-top-p, perplexity / delta PPL, greedy agreement."""
from __future__ import annotations

import math

import numpy as np
import pytest

from omni_export.errors import BadInput
from omni_export.parity.lm_metrics import greedy_agreement, kl_divergence, lm_stats, log_softmax, perplexity, same_top_p


def _logits(p):
    return np.log(np.asarray(p, dtype=np.float64))


def test_identical_logits_give_zero_kld_and_full_agreement():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 7, 50)).astype(np.float32) * 5
    t = rng.integers(0, 50, (2, 7))
    s = lm_stats(x, x, targets=t)
    assert s.positions == 14 and s.kld_mean == 0.0 and s.kld_p99 == 0.0 and s.kld_max == 0.0
    assert s.same_top_p == 1.0 and s.delta_ppl == 0.0 and s.ppl_ratio == 1.0 and s.ppl == s.ppl_fp32 > 1


def test_two_class_kl_divergence_by_hand():
    p, q = [0.5, 0.5], [0.9, 0.1]
    expect = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)  # 0.5108256...
    kld = kl_divergence(_logits([p]), _logits([q]))
    assert kld.shape == (1,) and kld[0] == pytest.approx(expect, rel=1e-12)
    # KL is not symmetric: KL(q || p) = 0.9 ln 1.8 + 0.1 ln 0.2
    assert kl_divergence(_logits([q]), _logits([p]))[0] == pytest.approx(0.9 * math.log(1.8) + 0.1 * math.log(0.2), rel=1e-12)
    # logits are shift-invariant
    assert kl_divergence(_logits([p]) + 1000.0, _logits([q]) - 1000.0)[0] == pytest.approx(expect, rel=1e-12)


def test_summary_statistics_mean_p99_max_and_same_top_p():
    ref = np.array([[2.0, 0.0]] * 100)
    out = ref.copy()
    out[:3] = [0.0, 2.0]  # 3 positions flip their argmax
    p1, p0 = 1 / (1 + math.exp(-2)), 1 / (1 + math.exp(2))
    flip = p1 * math.log(p1 / p0) + p0 * math.log(p0 / p1)
    s = lm_stats(ref, out)
    assert s.kld_max == pytest.approx(flip, rel=1e-12)
    assert s.kld_mean == pytest.approx(3 * flip / 100, rel=1e-12)
    assert s.kld_p99 == pytest.approx(np.percentile([flip] * 3 + [0.0] * 97, 99), rel=1e-12)
    assert s.same_top_p == 0.97 == same_top_p(ref, out)
    assert s.ppl is None and s.delta_ppl is None
    mask = np.arange(100) >= 3
    assert lm_stats(ref, out, mask=mask).kld_max == 0.0 and same_top_p(ref, out, mask=mask) == 1.0


def test_perplexity_and_delta_by_hand():
    ref = _logits([[0.5, 0.25, 0.25], [0.25, 0.5, 0.25]])
    out = _logits([[0.25, 0.5, 0.25], [0.25, 0.5, 0.25]])
    t = [0, 1]
    ppl_ref = math.exp(-(math.log(0.5) + math.log(0.5)) / 2)  # 2.0
    ppl_out = math.exp(-(math.log(0.25) + math.log(0.5)) / 2)  # 2 * sqrt 2
    assert perplexity(ref, t) == pytest.approx(ppl_ref, rel=1e-12)
    s = lm_stats(ref, out, targets=t)
    assert s.ppl_fp32 == pytest.approx(2.0) and s.ppl == pytest.approx(ppl_out, rel=1e-12)
    assert s.delta_ppl == pytest.approx(ppl_out - 2.0, rel=1e-12) and s.ppl_ratio == pytest.approx(math.sqrt(2), rel=1e-12)
    assert s.same_top_p == 0.5 and s.to_dict()["positions"] == 2
    uniform = np.zeros((4, 10))
    assert perplexity(uniform, [0, 3, 5, 9]) == pytest.approx(10.0, rel=1e-12)


def test_stable_on_extreme_logits():
    x = np.array([[1e4, 0.0, -1e4], [0.0, 0.0, -np.inf]])
    lp = log_softmax(x)
    assert np.isfinite(lp[0]).all() and lp[0, 0] == 0.0 and lp[1, 2] == -np.inf
    assert lp[1, 0] == pytest.approx(math.log(0.5), rel=1e-15)
    k = kl_divergence(x, x[:, ::-1])
    assert np.isfinite(k[0]) and k[0] > 1e3 and k[1] == np.inf  # ref mass where the artifact gives none


def test_greedy_agreement_length():
    assert greedy_agreement([5, 6, 7, 8], [5, 6, 9, 8]) == 2
    assert greedy_agreement([5, 6, 7], [5, 6, 7]) == 3
    assert greedy_agreement([5, 6, 7], [5, 6]) == 2
    assert greedy_agreement([1], [2]) == 0 and greedy_agreement([], [1]) == 0
    assert greedy_agreement(np.array([3, 4]), [3, 4, 5]) == 2


def test_bad_input_is_one_line():
    with pytest.raises(BadInput, match="differ in shape"):
        lm_stats(np.zeros((3, 4)), np.zeros((3, 5)))
    with pytest.raises(BadInput, match="NaN"):
        lm_stats(np.full((2, 3), np.nan), np.zeros((2, 3)))
    with pytest.raises(BadInput, match="target ids must lie in"):
        perplexity(np.zeros((2, 3)), [0, 3])
    with pytest.raises(BadInput, match="3 targets for 2 positions"):
        lm_stats(np.zeros((2, 3)), np.zeros((2, 3)), targets=[0, 1, 2])
    with pytest.raises(BadInput, match="no position to score"):
        lm_stats(np.zeros((2, 3)), np.zeros((2, 3)), mask=[False, False])
