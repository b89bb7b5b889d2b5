"""Sink-free decode-step calibration and parity on the tiny llama: position 0 and outlier tokens are left out of the
calibration samples (``components/lm_sinks.py``), and the decode step's parity takes position 0 from the reference."""
import numpy as np
import pytest
import torch

from omni_export.components.base import PromptSet
from omni_export.components.lm_sinks import SINK_RATIO
from omni_export.families import build_model
from omni_export.parity.metrics import compare, snr_db

PROMPTS = ["a plain sentence of bytes", "another #sentence# with two sink bytes"]
OPTS = {"max_prompt_tokens": 32, "new_tokens": 4, "max_samples": 1000}


@pytest.fixture()
def planted():
    """The tiny llama with byte '#' made an attention-sink-like token: its embedding row scaled 3,000x drives the
    residual stream far above every other position's."""
    bundle = build_model("llama", "tiny", seed=0)
    comp = bundle.family.components["decode_step"](bundle, context=64)
    sink = bundle.tokenizer.encode("#")[-1]
    with torch.no_grad():
        bundle.module.input_embedding().weight[sink] *= 3000.0
    return comp, sink


def _prompts():
    return PromptSet("sinks-test", tuple(PROMPTS))


def test_calibration_leaves_out_position_0_and_outlier_tokens(planted):
    comp, sink = planted
    prompts = _prompts()
    plan = comp.sinks(prompts, OPTS)
    ids = [comp.encode(p, 32) for p in PROMPTS]
    assert all(0 in e for e in plan.excluded)
    hashes = [p for p, t in enumerate(ids[1]) if t == sink]
    assert len(hashes) == 2 and set(hashes) <= plan.excluded[1]
    assert plan.excluded[0] == {0}  # no outlier in the plain sentence
    note = plan.note()
    assert note["excluded_token_ids"][str(sink)] >= 2 and note["threshold"] == pytest.approx(SINK_RATIO * note["median_absmax"], abs=1e-2)
    full = sum(plan.steps)
    assert comp.calibration_steps(prompts, OPTS) == plan.total == full - note["excluded_positions"]
    streamed = list(comp.calibration_feeds(prompts, OPTS))
    batched = dict(comp.indexed_calibration_feeds(prompts, OPTS, set(range(plan.total))))
    assert len(streamed) == len(batched) == plan.total
    for i, f in enumerate(streamed):  # the same samples in the same order, whichever capture writes them
        assert np.allclose(f["embeds"], batched[i]["embeds"]) and np.allclose(f["k_cache_0"], batched[i]["k_cache_0"], atol=1e-5)
    embeds = np.concatenate([f["embeds"].reshape(-1) for f in streamed])
    assert np.abs(embeds).max() < 100 * np.abs(comp.embedding[ids[0]]).max()  # no sink row was fed
    kept = comp.sinks(prompts, {**OPTS, "calibrate_sinks": True})  # the naive scheme calibrates on everything
    assert kept.total == full and comp.calibration_note(prompts, OPTS)["attention_sinks"]["kept_positions"] == plan.total


def test_decode_parity_takes_position_0_from_the_reference_and_judges_from_position_1(planted):
    comp, _ = planted
    ref = comp.reference(_prompts(), {"max_prompt_tokens": 32, "new_tokens": 4})
    calls = []

    def zeros(feed):  # a broken artifact: zeros everywhere
        calls.append(1)
        return [np.zeros(s.shape, np.float32) for s in comp.output_specs()]
    trace = comp.trace(zeros, ref, None)
    for r, t in zip(ref, trace):  # position 0 is the reference's, never a graph call
        assert all(np.array_equal(t.outputs[n][0], r.outputs[n][0]) for n in t.outputs)
    steps = sum(len(t.outputs["logits"]) for t in trace)
    # teacher-forced, minus position 0 of each; the free run reuses the prompt's calls (the same inputs) and executes
    # from the first generated token on, where the broken artifact's choice (token 0) already differs from fp32's
    n_prompt = sum(r.n_prompt for r in ref)
    assert all(r.generated[0] != 0 for r in ref)
    assert len(calls) == (steps - len(ref)) + (steps - n_prompt)
    lm = compare(ref, trace, lm=True)["lm"]
    assert lm["first_position"] == 1 and lm["kld_positions"] == steps - len(ref)
    assert "sink" in comp.reference_note and "position 1" in comp.reference_note


def test_free_run_reuses_teacher_forced_calls_only_while_the_artifact_follows_fp32(planted):
    """The free-running greedy tokens equal a free run that executes every call: nothing is reused once the
    artifact's token differs from fp32's, and a faithful artifact costs no second pass."""
    comp, _ = planted
    ref = comp.reference(_prompts(), {"max_prompt_tokens": 32, "new_tokens": 6})
    eager = comp.eager_runner()
    for flip_at in (None, 2, 4):  # the artifact's greedy choice is forced off fp32's at this generated token
        for r in ref:
            calls = []

            def artifact(feed, r=r, flip_at=flip_at):
                calls.append(1)
                o = eager(feed)
                pos = len(calls)  # position 0 never reaches the artifact (the prefill's row)
                if flip_at is not None and pos == r.n_prompt - 1 + flip_at:
                    o[0] = o[0].copy()
                    o[0][..., int(np.argmax(o[0]))] -= 1e4  # its top-1 token demoted: another one is chosen
                return o

            forced = comp.trace(artifact, [r], None)[0]
            n_forced = len(calls)
            calls.clear()
            _, full = comp.run_tokens(comp.sink_from_reference(artifact, r), r.tokens[: r.n_prompt],
                                      n_new=len(r.generated))
            n_full = len(calls)
            assert forced.generated == full
            if flip_at is None:
                assert full == r.generated and n_forced == len(r.tokens) - 1  # one pass: the free run was all reused
            else:
                assert full[:flip_at] == r.generated[:flip_at] and full[flip_at] != r.generated[flip_at]
                # the free run executed from the flipped token's next position to its end
                assert n_forced - (len(r.tokens) - 1) == n_full - (r.n_prompt - 1 + flip_at)


def test_stored_cache_rows_read_back_as_the_arrays_the_capture_fed(planted, tmp_path):
    """The decode step stores each KV cache input as row indices into a per-sequence pool of the rows the fp32
    steps wrote (``Rows``); read back, every sample is bit-identical to the feed the batched capture produced."""
    from omni_export.calibration.dataset import CalibrationSet, POOL_DIR, write_indexed_set

    comp, _ = planted
    prompts = _prompts()
    keep = set(range(comp.calibration_steps(prompts, OPTS)))
    plain = dict(comp.indexed_calibration_feeds(prompts, OPTS, keep))
    pools: dict = {}
    cs = write_indexed_set(tmp_path, comp.indexed_calibration_feeds(prompts, OPTS, keep, pools=pools), keep,
                           prompts.name, prompts.hash, pools)
    assert (tmp_path / POOL_DIR).is_dir() and len(list((tmp_path / POOL_DIR).glob("*.npy"))) == 2 * 2 * comp.cfg.num_hidden_layers
    back = list(CalibrationSet.open(tmp_path))
    assert len(back) == len(plain) == cs.samples
    for i, f in enumerate(back):
        assert set(f) == set(plain[i])
        for k, v in plain[i].items():
            assert f[k].dtype == v.dtype and np.array_equal(f[k], v), (i, k)
    assert any(np.abs(f["k_cache_0"]).sum() > 0 for f in back)  # real rows, not only empty slots
    # the set's hash covers the pools: a changed pool row is another set
    name = sorted((tmp_path / POOL_DIR).glob("*.npy"))[0]
    a = np.load(name)
    a[..., 0, 0] += 1.0
    other = tmp_path / "other"
    other.mkdir()
    pools[name.stem] = a
    cs2 = write_indexed_set(other, comp.indexed_calibration_feeds(prompts, OPTS, keep, pools={}), keep,
                            prompts.name, prompts.hash, pools)
    assert cs2.hash != cs.hash


def test_the_sink_plans_pass_records_the_capture_and_a_second_pass_writes_the_same_set(planted, tmp_path, monkeypatch):
    """The calibration capture keeps its samples from the sink plan's own batched fp32 pass (``lm_capture``): one
    eager pass for plan and capture instead of two, and the same set, byte for byte, as a capture that runs its
    own pass."""
    from omni_export.calibration.dataset import write_indexed_set
    from omni_export.components.decoder_lm import DecodeStepComponent

    comp, _ = planted
    prompts = _prompts()
    comp._sinks = (None,)  # a fresh plan: measured (and recorded) in the next call
    passes = []
    real = DecodeStepComponent.batched_steps

    def counted(self, *a, **k):
        passes.append(1)
        yield from real(self, *a, **k)

    monkeypatch.setattr(DecodeStepComponent, "batched_steps", counted)
    keep = set(range(0, comp.calibration_steps(prompts, OPTS), 2))
    sets = []
    for name in ("recorded", "own_pass"):  # the record is used once; the second capture runs a pass of its own
        (tmp_path / name).mkdir()
        pools: dict = {}
        sets.append(write_indexed_set(tmp_path / name, comp.indexed_calibration_feeds(prompts, OPTS, keep, pools),
                                      keep, prompts.name, prompts.hash, pools))
        if name == "recorded":
            assert len(passes) == 1  # the plan's pass, and no other
    assert len(passes) == 2 and sets[0].hash == sets[1].hash and sets[0].samples == len(keep)
    for a, b in zip(sorted((tmp_path / "recorded").rglob("*.np*")), sorted((tmp_path / "own_pass").rglob("*.np*"))):
        assert a.name == b.name and a.read_bytes() == b.read_bytes(), a.name


def test_the_sink_row_is_neither_compared_nor_counted_against_the_step_budget(planted):
    """Position 0 is the reference's own row in the trace: comparing it would add the sink's (huge) energy as signal
    with no error and lift every SNR; counting it would spend the step budget on rows no graph computed."""
    comp, _ = planted
    ref = comp.reference(_prompts(), {"max_prompt_tokens": 32, "new_tokens": 4})
    eager = comp.eager_runner()
    calls = []

    def noisy(feed):  # an artifact with a fixed, small relative error on every output of every call
        calls.append(1)
        return [o * np.float32(1.01) for o in eager(feed)]
    first = comp.parity_first_step
    assert first == 1
    trace = comp.trace(noisy, ref, None)
    fair, naive = compare(ref, trace, lm=False, first_step=first), compare(ref, trace, lm=False)
    assert fair["steps"] == naive["steps"] - len(ref) and fair["first_step"] == 1
    for n, o in fair["outputs"].items():  # exactly the rows the graph computed, and no better than its 1 % gain error
        rows = [(r.outputs[n][1: len(t.outputs[n])], t.outputs[n][1:]) for r, t in zip(ref, trace)]
        assert o["snr_db"] == pytest.approx(snr_db(*map(np.concatenate, zip(*rows))), abs=1e-3), n
        assert o["snr_db"] <= 40.0 + 1e-3, n
    # the sink row (identical, and of a huge norm in the planted model) would have read as far better than 40 dB
    # a trained model's sink row carries a huge norm (SmolLM2: a 25,800 outlier): identical in both traces, it
    # leaves the figures as they were, where counting it would have read as near-perfect
    loud = lambda seqs: [type(q)(q.tokens, q.n_prompt, {n: np.concatenate([v[:1] * 1e3, v[1:]])
                                                        for n, v in q.outputs.items()}) for q in seqs]
    assert compare(loud(ref), loud(trace), lm=False, first_step=first)["outputs"] == fair["outputs"]
    assert all(o["snr_db"] > 60 for o in compare(loud(ref), loud(trace), lm=False)["outputs"].values())

    for budget in (1, 3):  # a budget of N steps is N graph calls, and N steps compared
        calls.clear()
        t = comp.trace(noisy, ref, budget)
        assert len(calls) == budget and compare(ref, t, lm=False, first_step=first)["steps"] == budget
    with pytest.raises(ValueError, match="no steps to compare"):
        compare(ref, [type(r)(r.tokens[:1], r.n_prompt, {n: v[:1] for n, v in r.outputs.items()}) for r in ref],
                lm=False, first_step=first)


def test_the_calibration_pass_runs_the_head_only_where_a_row_chooses_its_next_token(planted):
    """``head_rows_runner`` (the sink plan's and capture's pass): the same K/V rows and the same greedy tokens as the
    whole eager step, each chosen token's logits row identical, every row that chooses nothing left at zero."""
    comp, _ = planted
    ids = [comp.encode(p, OPTS["max_prompt_tokens"]) for p in PROMPTS]
    n_new = [OPTS["new_tokens"]] * len(ids)
    whole = list(comp.batched_steps(comp.eager_runner(), ids, n_new))
    rows = list(comp.batched_steps(comp.head_rows_runner(), ids, n_new))
    assert len(whole) == len(rows) and whole[-1][4] == rows[-1][4] and all(len(g) == 4 for g in rows[-1][4])
    chose = 0
    for (pos, active, f, o, _), (_, _, g, q, _) in zip(whole, rows):
        assert f.keys() == g.keys() and all(np.array_equal(f[k], g[k]) for k in f)
        for a, b in zip(o[1:], q[1:]):
            np.testing.assert_array_equal(a, b)
        for b in range(len(ids)):
            if len(ids[b]) - 1 <= pos < len(ids[b]) - 1 + OPTS["new_tokens"]:  # this row chooses a token
                np.testing.assert_allclose(q[0][b], o[0][b], rtol=1e-5, atol=1e-5)
                chose += 1
            else:
                assert not q[0][b].any()
    assert chose == 4 * len(ids)
