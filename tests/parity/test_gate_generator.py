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


def test_the_generating_runtime_reaches_every_parity_prompt_not_only_the_traced_ones():
    """The step budget traced one sequence; the runtime still generates the first FIRST_TOKENS tokens of every other
    prompt, and its logits there count: a bundle faithful on the traced prompt but not on the others' first tokens
    (measured on SmolLM2's w8a16 Genie bundle: 32.5 dB on the first prompt, 28.2-28.5 dB on two others) is judged on
    all of them."""
    from types import SimpleNamespace

    import numpy as np

    from omni_export.parity.execute import FIRST_TOKENS, generated

    rng = np.random.default_rng(0)
    refs = []
    for n_prompt, n_gen in ((3, 10), (4, 6), (2, 2)):
        logits = rng.standard_normal((n_prompt + n_gen, 1, 32)).astype(np.float32)
        refs.append(SimpleNamespace(tokens=list(range(n_prompt + n_gen)), n_prompt=n_prompt,
                                    generated=[int(t) for t in logits[n_prompt - 1:-1].reshape(n_gen, -1).argmax(-1)],
                                    outputs={"logits": logits}))
    got = [SimpleNamespace(generated=None, stopped_at_eos=False)]  # the budget reached the first sequence only
    asked = []

    def generate(prompts, n_new, noise=(0.0, 1.0, 1.0)):
        asked.append((prompts, n_new))
        rows = [r.outputs["logits"][r.n_prompt - 1: r.n_prompt - 1 + n].reshape(n, -1) + e *
                rng.standard_normal((n, 32)).astype(np.float32) for r, n, e in zip(refs, n_new, noise)]
        return {"ids": [r.generated[:n] for r, n in zip(refs, n_new)], "logits": rows, "refused": None}

    out = generated(generate, refs, got)
    assert asked[0][1] == [10, min(6, FIRST_TOKENS), 2] and [len(p) for p in asked[0][0]] == [3, 4, 2]
    assert got[0].generated == refs[0].generated  # the traced sequence's greedy ids are the runtime's
    assert out["prompts"] == 3 and out["positions"] == 10 + min(6, FIRST_TOKENS) + 2
    only_traced = generated(lambda p, n: generate(p, n, (0.0, 0.0, 0.0)), refs, got)
    assert only_traced["logits_snr_db"] > 100 > out["logits_snr_db"]  # the others' noisy first tokens show
