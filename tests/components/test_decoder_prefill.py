"""AR-N prefill: per prompt position it computes what the AR-1 decode loop computes (chunk and window boundaries
crossed), hands the decode loop the same caches, and its exported graph runs like the eager one."""
import numpy as np
import pytest

from shared_stores import copy_store

from omni_export.components.decoder_lm import DecodeStepComponent
from omni_export.components.decoder_prefill import PrefillComponent
from omni_export.parity.metrics import log_softmax

TOKENS = [int(t) for t in np.random.RandomState(0).randint(3, 4000, 45)]  # > 2 windows of 16, 5 chunks + a partial


@pytest.mark.parametrize("parts", [1, 2])
def test_prefill_equals_the_decode_loop_position_by_position(tiny_spark, parts):
    dec = DecodeStepComponent(tiny_spark, 64)
    pre = PrefillComponent(tiny_spark, 64, rows=8, parts=parts)
    d, _ = dec.run_tokens(dec.eager_runner(), TOKENS)
    p = pre.prefill(pre.eager_runner(), TOKENS)
    assert set(p) == set(d)
    for k in d:
        assert p[k].shape == d[k].shape, k
        assert np.abs(p[k] - d[k]).max() < 1e-4, k
    lp, ld = (log_softmax(x.reshape(len(TOKENS), -1)) for x in (p["logits"], d["logits"]))
    assert np.array_equal(lp.argmax(-1), ld.argmax(-1)) and np.abs(lp - ld).max() <= 1e-4


def test_decode_continues_from_prefilled_caches(tiny_spark):
    """Prefill the prompt, then decode greedily from the caches it wrote: the same tokens as decoding throughout."""
    dec = DecodeStepComponent(tiny_spark, 64)
    pre = PrefillComponent(tiny_spark, 64, rows=8)
    prompt, n_new = TOKENS[:21], 12
    _, want = dec.run_tokens(dec.eager_runner(), prompt, n_new=n_new)
    caches = pre.new_caches()
    last = None
    for p0 in range(0, len(prompt), pre.rows):
        chunk = prompt[p0:p0 + pre.rows]
        o = pre.eager_runner()(pre.feed_chunk(caches, chunk, p0))
        pre.write_chunk(caches, o, p0, len(chunk))
        last = o[0][0, len(chunk) - 1]
    got, tok, run = [int(np.argmax(last))], None, dec.eager_runner()
    for pos in range(len(prompt), len(prompt) + n_new - 1):
        o = run(dec.feed(caches, got[-1], pos))
        dec.write(caches, o, pos)
        got.append(int(np.argmax(o[0])))
    assert got == want


def test_pad_rows_never_reach_real_rows(tiny_spark):
    """The last chunk's pad rows are masked out of every real row: changing the pad token changes nothing real."""
    pre = PrefillComponent(tiny_spark, 64, rows=8)
    caches = pre.new_caches()
    a = pre.feed_chunk(caches, TOKENS[:5], 0)
    b = {**a, "embeds": a["embeds"].copy()}
    b["embeds"][:, 5:] = 7.0
    run = pre.eager_runner()
    oa, ob = run(a), run(b)
    assert np.array_equal(oa[0][:, :5], ob[0][:, :5]) and not np.array_equal(oa[0][:, 5:], ob[0][:, 5:])


def test_prefill_options_are_checked(tiny_spark):
    with pytest.raises(ValueError, match="rows"):
        PrefillComponent(tiny_spark, 64, rows=16)  # window 16: at most 15 rows
    with pytest.raises(ValueError, match="simulator_calls"):
        PrefillComponent(tiny_spark, 64, rows=8, simulator_calls=-1)


def test_exported_prefill_parts_run_like_eager(tiny_spark, tmp_path):
    from omni_export.lowering.onnx_export import export_onnx
    from omni_export.runtimes.ort import ort_cpu
    pre = PrefillComponent(tiny_spark, 64, rows=8, parts=2)
    runners = {g.name: ort_cpu(export_onnx(g.module, g, tmp_path / f"{g.name}.onnx"), [s.name for s in g.outputs])
               for g in pre.graphs()}
    e, o = pre.prefill(pre.eager_runner(), TOKENS), pre.prefill(pre.chain(runners), TOKENS)
    assert np.abs(e["logits"] - o["logits"]).max() < 1e-4


@pytest.mark.slow
def test_a_zero_simulator_budget_is_unverified_not_a_crash(tmp_path):
    """At full size the prefill runs no call on the HTP simulator (simulator_calls 0): its context binary is built
    and reported unverified, never published as passing."""
    import dataclasses

    from omni_export.artifacts.store import Store
    from omni_export.pipeline import Pipeline
    from omni_export.recipes import Build, CalibrationSpec, load_recipe
    r = load_recipe("spark_w8a16")
    r = dataclasses.replace(r, components=("prefill",), builds=(Build("qnn_context", "w8a16"),),
                            options={"prefill": {"rows": 8, "prompt_tokens": 16, "simulator_calls": 0}},
                            calibration=CalibrationSpec(max_samples=8, new_tokens=1), presets={})
    res = Pipeline(r, Store(tmp_path)).run()
    (art,) = res.artifacts
    assert art.status == "unverified" and "completed no graph call" in art.reasons[0]
    assert res.exit_code == 0 and (tmp_path / "unverified" / r.name / art.artifact_id / "manifest.json").exists()


@pytest.mark.slow
def test_prefill_and_decode_share_one_context_binary_reported_unverified(tmp_path, shared_store):
    """qnn_context_shared: one binary for both programs, smaller than the two compiled apart; the x86 simulator cannot
    load it, so it is unverified (never published), while each program compiled unshared is executed and gated.
    Starts from a copy of the shared spark_w8a16 store: its QDQ builds, context binaries and their parity are
    finished steps there, so only the weight-shared compile is new work."""
    import dataclasses

    from omni_export.artifacts.store import Store
    from omni_export.pipeline import Pipeline
    from omni_export.recipes import Build, load_recipe
    r = load_recipe("spark_w8a16")
    r = dataclasses.replace(r, builds=(Build("qnn_context", "w8a16"), Build("qnn_context_shared", "w8a16", ("prefill",))))
    store = copy_store(shared_store("spark_w8a16").path, tmp_path / "store")
    res = Pipeline(r, Store(store)).run()
    arts = {a.artifact_id: a for a in res.artifacts}
    shared = arts.pop("prefill.w8a16.qnn_context_shared.sm8750")
    assert all(a.status == "pass" for a in arts.values())
    assert shared.status == "unverified" and "weight-shared" in shared.reasons[0]
    (shared_bin,) = shared.shelf_dir.glob("*.bin")
    assert shared.shelf_dir.parent.parent.name == "unverified"
    assert {p.name for p in shared.shelf_dir.glob("*_ctx.onnx")} == {"decode_step.model_ctx.onnx", "model_ctx.onnx"}
    apart = sum(p.stat().st_size for a in arts.values() for p in a.shelf_dir.glob("*.bin"))
    assert shared_bin.stat().st_size < 0.7 * apart  # one copy of the weights for both programs


@pytest.mark.parametrize("keep", [{0, 3, 7, 10}, {1}, set(range(12)), {2, 5, 11}, set()])
def test_calibration_chunks_run_only_where_a_later_kept_chunk_reads_them(tiny_spark, monkeypatch, keep):
    """The kept chunks' feeds are those of every chunk in order (``calibration_feeds``), byte for byte, while the
    eager prefill runs only the chunks before a prompt's last kept chunk."""
    from omni_export.components.base import PromptSet
    pre = PrefillComponent(tiny_spark, 64, rows=8, prompt_tokens=20)  # 3 chunks a prompt (8 + 8 + 4 rows)
    prompts = PromptSet("cal", ("the first prompt, a little longer than twenty bytes",
                                "a second one, also longer than twenty bytes", "a third prompt of the set here",
                                "and a fourth prompt, long enough too"))
    every = list(pre.calibration_feeds(prompts, {}))
    assert len(every) == 12
    calls, eager = [], pre.eager_runner
    monkeypatch.setattr(pre, "eager_runner", lambda *a: (lambda run: lambda f: calls.append(1) or run(f))(eager(*a)))
    got = list(pre.indexed_calibration_feeds(prompts, {}, keep))
    assert [i for i, _ in got] == sorted(keep)
    for i, f in got:
        assert f.keys() == every[i].keys() and all(np.array_equal(f[k], every[i][k]) for k in f), i
    lasts = {p: max(c for c in range(3) if 3 * p + c in keep) for p in range(4) if any(3 * p + c in keep for c in range(3))}
    assert len(calls) == sum(lasts.values())


@pytest.mark.parametrize("bad", [0, -3])
def test_prompt_tokens_below_one_is_refused_not_defaulted(tiny_spark, bad):
    """``prompt_tokens: 0`` once fell through to the default length and ran a whole recipe."""
    with pytest.raises(ValueError, match=f"prompt_tokens must be >= 1, got {bad}"):
        PrefillComponent(tiny_spark, 64, rows=8, prompt_tokens=bad)
