"""A bundle whose own runtime generates (Genie, onnxruntime-genai) is judged on the logits that runtime computed, not
only on the teacher-forced figures: measured on the trained SmolLM2, a w8a16 Genie bundle scored 31.1 dB
teacher-forced (fp32's caches fed in) while Genie's own first generated logits were at -4.5 dB (its quantized
graphs computed the attention sink themselves) and its text was ": \\n\\n" repeated."""
from omni_export.audit.ci_gate import _cross_check, _figure_key
from omni_export.parity.gate import GENERATOR, Threshold, judge

BAR = Threshold("snr_db", "logits", min=30, reason="the logits bar")
KV = Threshold("snr_db", "k_*", min=25, reason="the cache rows' bar")


def _report(gen_snr, positions=1):
    return {"outputs": {"logits": {"snr_db": 31.1}, "k_new_0": {"snr_db": 29.4}},
            "generator": {"refused": None, "positions": positions, "logits_snr_db": gen_snr}}


def test_the_own_runtimes_generated_logits_meet_the_logits_bar():
    v = judge(_report(-4.549), [BAR, KV], ["logits", "k_new_0"])
    assert v["status"] == "blocked" and v["reasons"] == ["generator snr_db = -4.549, required >= 30"]
    (g,) = [c for c in v["checks"] if c["output"] == GENERATOR]
    assert (g["value"], g["status"], g["reason"]) == (-4.549, "fail", "the logits bar")
    assert judge(_report(38.3), [BAR, KV], ["logits", "k_new_0"])["status"] == "pass"
    # the K/V bar is not applied to the generated logits, and without generated positions there is no such check
    assert [c["output"] for c in judge(_report(38.3), [KV], ["logits", "k_new_0"])["checks"]] == ["k_new_0"]
    assert GENERATOR not in [c["output"] for c in judge(_report(None, 0), [BAR], ["logits", "k_new_0"])["checks"]]


def test_generated_positions_without_their_figure_fail_closed_and_the_ci_gate_reads_the_same_figure():
    v = judge(_report(None), [BAR], ["logits", "k_new_0"])
    assert v["status"] == "blocked" and "generator snr_db was not measured (required >= 30)" in v["reasons"]
    report = _report(38.3)
    v = judge(report, [BAR], ["logits", "k_new_0"])
    assert _cross_check(v, report, "") == [] and _figure_key(GENERATOR, "snr_db") == "parity.metrics.generator.logits_snr_db"
    report["generator"]["logits_snr_db"] = 40.0  # an edited figure shows
    assert _cross_check(v, report, "") == ["parity.metrics.generator.logits_snr_db = 40.0 but the verdict's check "
                                           "records 38.3"]
