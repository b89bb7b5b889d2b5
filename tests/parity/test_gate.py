"""Metrics and the gate: exact figures on known inputs; the gate fails closed."""
import math

import numpy as np
import pytest

from omni_export.components.base import Sequence
from omni_export.errors import RecipeError
from omni_export.parity.gate import BLOCKED, PASS, Threshold, judge
from omni_export.parity.metrics import SNR_CAP, compare, snr_db


def test_snr_db_known_values():
    x = np.ones(1000, np.float32)
    assert snr_db(x, x) == SNR_CAP
    assert math.isclose(snr_db(x, x * 1.1), 20.0, abs_tol=1e-4)  # noise energy 1 % of signal
    assert snr_db(x, np.full(1000, np.nan)) == -SNR_CAP


def _seq(logits, gen, n_prompt=2):
    return Sequence(tokens=[0] * len(logits), n_prompt=n_prompt, outputs={"logits": np.asarray(logits, np.float32)},
                    generated=gen)


def test_token_metrics():
    ref = _seq([[0, 0, 1], [5, 0, 0], [0, 5, 0]], gen=[0, 1])
    same = compare([ref], [_seq([[0, 0, 1], [5, 0, 0], [0, 5, 0]], gen=[0, 1])], lm=True)
    assert same["lm"]["top1_agreement"] == 1.0 and same["lm"]["greedy_agreement"] == 1.0
    assert same["lm"]["max_logprob_delta"] == 0.0
    flip = compare([ref], [_seq([[0, 0, 1], [5, 0, 0], [5, 0, 0]], gen=[0, 0])], lm=True)
    assert flip["lm"]["top1_agreement"] == 0.5 and flip["lm"]["greedy_agreement"] == 0.5
    assert flip["lm"]["max_logprob_delta"] > 4


def test_gate_fails_closed_when_a_metric_was_not_measured():
    report = {"outputs": {"logits": {"snr_db": 60.0}}, "lm": {"top1_agreement": 1.0, "greedy_agreement": None}}
    th = [Threshold("snr_db", "logits", min=45, reason="r"), Threshold("greedy_agreement", min=1.0, reason="r")]
    v = judge(report, th, ["logits"])
    assert v["status"] == BLOCKED and "greedy_agreement was not measured" in v["reasons"][0]
    assert judge(report, th[:1], ["logits"])["status"] == PASS
    assert judge(report, [], ["logits"])["status"] == BLOCKED


def test_threshold_validation():
    with pytest.raises(RecipeError):
        Threshold("snr_db", min=1, max=2, reason="r")
    with pytest.raises(RecipeError):
        Threshold("psnr", min=1, reason="r")
    with pytest.raises(RecipeError, match="matches no output"):
        judge({"outputs": {}}, [Threshold("snr_db", "k_*", min=1, reason="r")], ["logits"])
