"""LM figures in every LM component's parity (``parity.metrics.lm_figures``) and the gate's LM thresholds."""
import numpy as np
import pytest

from omni_export.components.base import Sequence
from omni_export.errors import RecipeError
from omni_export.parity.gate import Threshold, judge
from omni_export.parity.metric_specs import METRICS
from omni_export.parity.lm_metrics import kl_divergence, perplexity
from omni_export.parity.metrics import compare

V = 11


def _seq(rng, tokens, n_prompt, generated, noise=0.0, base=None):
    steps = len(tokens)
    logits = rng.normal(size=(steps, 1, V)) * 3 if base is None else base + noise * rng.normal(size=(steps, 1, V))
    return Sequence(list(tokens), n_prompt, {"logits": logits.astype(np.float32)}, list(generated))


def test_kld_and_perplexity_skip_position_0_and_score_only_text_targets():
    rng = np.random.default_rng(0)
    tokens, n_prompt, gen = [3, 1, 4, 1, 5, 9, 2], 4, [5, 9, 2, 6]  # prompt 4 tokens, 3 greedy tokens fed back
    ref = _seq(rng, tokens, n_prompt, gen)
    art = _seq(rng, tokens, n_prompt, gen, noise=0.5, base=ref.outputs["logits"].astype(np.float64))
    art.generated = [5, 9, 7, 6]
    art.outputs["logits"][0] += 50.0  # position 0 (the sink, written by the prefill) is not judged
    lm = compare([ref], [art], lm=True)["lm"]
    r, a = ref.outputs["logits"][1:, 0], art.outputs["logits"][1:, 0]
    assert lm["first_position"] == 1 and lm["kld_positions"] == 6
    assert lm["kld_mean"] == pytest.approx(kl_divergence(r, a).mean())
    assert lm["kld_max"] == pytest.approx(kl_divergence(r, a).max()) and lm["kld_p99"] <= lm["kld_max"]
    # held-out text: positions 1..2 predict prompt tokens 2..3; later targets are fp32's own greedy tokens
    assert lm["ppl_positions"] == 2
    assert lm["ppl_fp32"] == pytest.approx(perplexity(r[:2], tokens[2:4]))
    assert lm["ppl_ratio"] == pytest.approx(perplexity(a[:2], tokens[2:4]) / lm["ppl_fp32"])
    assert lm["greedy_tokens"] == [2] and lm["greedy_tokens_min"] == 2 and lm["greedy_agreement"] == 0.75


def test_a_prompt_of_condition_rows_is_no_text_to_score():
    """A TTS head's prompt rows are conditions gathered by ids past its code vocabulary: KLD and top-1 are judged,
    the held-out-text perplexity is not (it has no text), and nothing fails."""
    rng = np.random.default_rng(2)
    tokens, gen = [V + 3, V + 4, V + 5, V + 6, 5, 9], [5, 9, 2]
    ref = _seq(rng, tokens, 4, gen)
    lm = compare([ref], [ref], lm=True)["lm"]
    assert "ppl_positions" not in lm and lm["kld_positions"] == 5 and lm["kld_mean"] == 0.0 and lm["top1_positions"] == 3


def test_prefill_sequences_score_every_token_as_text():
    rng = np.random.default_rng(1)
    tokens = [2, 7, 1, 8, 2, 8]
    ref = _seq(rng, tokens, 1, [0] * 6)
    ref.generated = [int(t) for t in ref.outputs["logits"][:, 0].argmax(-1)]
    lm = compare([ref], [ref], lm=True)["lm"]
    assert lm["ppl_positions"] == 4 and lm["kld_mean"] == 0.0 and lm["same_top_p"] == 1.0 and lm["ppl_ratio"] == 1.0
    assert lm["top1_positions"] == 5  # positions 1..5


def test_lm_thresholds_and_min_positions():
    report = {"lm": {"kld_mean": 4e-3, "kld_positions": 300, "top1_agreement": 0.9, "top1_positions": 12,
                     "kld_p99": 0.2}}
    th = [Threshold("kld_mean", max=5e-3, reason="r"), Threshold("kld_p99", max=5e-2, reason="r"),
          Threshold("top1_agreement", min=0.94, min_positions=256, reason="noise on 12 steps")]
    v = judge(report, th, ["logits"])
    assert v["status"] == "blocked" and v["reasons"] == ["lm kld_p99 = 0.2, required <= 0.05"]
    top1 = [c for c in v["checks"] if c["metric"] == "top1_agreement"][0]
    # recorded, not enforced: skipped, never passed (ok is None, not True)
    assert top1["status"] == "skipped" and top1["ok"] is None and top1["ok"] is not True
    assert top1["skipped"] == "12 positions < 256: too few to judge, not enforced"
    assert {c["metric"]: c["status"] for c in v["checks"]} == {"kld_mean": "pass", "kld_p99": "fail",
                                                                 "top1_agreement": "skipped"}
    report["lm"]["top1_positions"] = 256
    assert "lm top1_agreement = 0.9, required >= 0.94" in judge(report, th, ["logits"])["reasons"]
    # no position of its kind in the executed steps (HTP steps inside a long prompt: no generated token): too few
    # to judge as well, where min_positions is declared; without it, a missing figure fails closed
    report["lm"].update(top1_agreement=None, top1_positions=0, kld_p99=1e-2)
    v = judge(report, th, ["logits"])
    top1 = [c for c in v["checks"] if c["metric"] == "top1_agreement"][0]
    assert v["status"] == "pass" and top1["status"] == "skipped" and top1["skipped"].startswith("0 positions < 256")
    v = judge(report, th[:2] + [Threshold("top1_agreement", min=0.94, reason="r")], ["logits"])
    assert v["status"] == "blocked" and "top1_agreement was not measured" in v["reasons"][0]
    report["lm"].pop("top1_positions")  # the count itself missing: not measured, blocked
    assert judge(report, th, ["logits"])["status"] == "blocked"
    assert all(METRICS[m].lower_is_better for m in ("kld_mean", "kld_p99", "kld_max", "ppl_ratio"))
    with pytest.raises(RecipeError, match="min_positions applies to LM metrics only"):
        Threshold("snr_db", min=30, min_positions=10, reason="r")
