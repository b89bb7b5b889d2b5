"""Parity of a chain of graphs with one graph's session open at a time (``parity.execute.part_major``): the same
figures as the chain, bit for bit, each part's session made once and never two at once, and a replayed call whose
inputs differ from its one-graph pass refused."""
import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest
from rich.console import Console

from omni_export.components.base import PromptSet
from omni_export.exporters import get_target
from omni_export.families import build_model
from omni_export.parity.execute import _fingerprint, execute

PROMPTS = PromptSet("part-major", ("a plain sentence of bytes", "another sentence, a little longer than that one"))
OPTS = {"max_prompt_tokens": 32, "new_tokens": 6}
QUIET = Console(quiet=True)


def _split(name, tmp_path):
    """A tiny llama component in two parts, its fp32 ONNX build, its execution and its fp32 reference."""
    bundle = build_model("llama", "tiny", seed=0)
    kw = {"parts": 2} if name == "decode_step" else {"parts": 2, "rows": 8}
    comp = bundle.family.components[name](bundle, context=64, **kw)
    target = get_target("onnx")
    built = target.export(SimpleNamespace(component=comp, scheme=SimpleNamespace(name="fp32")), tmp_path)
    return comp, target.execution(built, comp, None), comp.reference(PROMPTS, OPTS)


class Tracked:
    """A part's runner that counts the sessions alive at once."""
    live = peak = 0

    def __init__(self, run):
        self.run = run
        Tracked.live += 1
        Tracked.peak = max(Tracked.peak, Tracked.live)

    def __call__(self, feed):
        return self.run(feed)

    def __del__(self):
        Tracked.live -= 1


@pytest.mark.parametrize("name", ["decode_step", "prefill"])
def test_one_part_at_a_time_gives_the_chains_figures(name, tmp_path):
    comp, ex, ref = _split(name, tmp_path)
    assert [g.name for g in comp.graphs()] == ["part0", "part1"] and set(ex.parts) == {"part0", "part1"}
    chained = execute(comp, dataclasses.replace(ex, parts=None), ref, None, QUIET)
    made, chain_calls = [], []

    def make(n):
        made.append(n)
        return Tracked(ex.parts[n]())

    def chain(feed):  # the whole chain: only for calls no one-graph pass made (none here: fp32 follows fp32)
        chain_calls.append(1)
        return ex.run(feed)
    Tracked.live = Tracked.peak = 0
    one_at_a_time = dataclasses.replace(ex, run=chain, parts={n: (lambda n=n: make(n)) for n in ex.parts})
    got = execute(comp, one_at_a_time, ref, None, QUIET)
    assert json.dumps(got, sort_keys=True) == json.dumps(chained, sort_keys=True)
    assert made == ["part0", "part1"] and Tracked.peak == 1 and not chain_calls
    assert min(o["snr_db"] for o in got["parity"]["outputs"].values()) >= 100


def test_a_replayed_call_with_other_inputs_is_refused(tmp_path, monkeypatch):
    comp, ex, ref = _split("decode_step", tmp_path)
    passes = []
    trace = type(comp).trace

    def changed_last(self, run, reference, max_steps, **kw):  # the replay (third trace) feeds one other token
        passes.append(1)
        if len(passes) == 3:
            reference = [dataclasses.replace(reference[0], tokens=[*reference[0].tokens[:3], 7, *reference[0].tokens[4:]]),
                         *reference[1:]]
        return trace(self, run, reference, max_steps, **kw)
    monkeypatch.setattr(type(comp), "trace", changed_last)
    with pytest.raises(RuntimeError, match="call 2: part0's inputs differ"):
        execute(comp, ex, ref, None, QUIET)


def test_the_fingerprint_tells_calls_apart_at_any_size():
    small, large = np.zeros((4, 8), np.float32), np.zeros((1, 2, 511, 256), np.float32)
    base = _fingerprint({"a": small, "k_cache_0": large})
    for other in ({"a": small + 1e-7, "k_cache_0": large}, {"a": small, "k_cache_0": large + np.float32(1e-3)},
                  {"b": small, "k_cache_0": large}, {"a": small.reshape(8, 4), "k_cache_0": large}):
        assert _fingerprint(other) != base
    assert _fingerprint({"k_cache_0": large.copy(), "a": small.copy()}) == base


@pytest.mark.slow
def test_the_htp_simulator_and_its_cpu_qdq_companion_run_one_part_at_a_time(tmp_path):
    """A tiny Spark decode step in two parts, w8a16 compiled for SM8750: on the HTP simulator and on its CPU-QDQ
    companion (the three-way comparison) one part's session at a time gives the chain's figures bit for bit."""
    from omni_export.artifacts.store import Store
    from omni_export.devices import get_device
    from omni_export.exporters import shelved
    from omni_export.pipeline import Pipeline
    from omni_export.recipes import Build, load_recipe
    r = load_recipe("spark_w8a16").with_overrides(parts=2, simulator_steps=5)
    r = dataclasses.replace(r, builds=(Build("onnx", "fp32"), Build("qdq_onnx", "w8a16"), Build("qnn_context", "w8a16")),
                            components=("decode_step",), options={"decode_step": {"parts": 2}}, presets={})
    pipe = Pipeline(r, Store(tmp_path / "store"), QUIET)
    res = pipe.run()
    by = {a.target: a for a in res.artifacts}
    comp, plan = pipe.components["decode_step"], pipe.check()
    ref = comp.reference(plan.par_prompts, {"max_prompt_tokens": r.prompts.max_prompt_tokens, "new_tokens": r.parity.new_tokens})
    built = shelved(by["qnn_context"])
    built.deps.append(shelved(by["qdq_onnx"]))
    ex = get_target("qnn_context").execution(built, comp, get_device(r.device))
    assert set(ex.parts) == {"part0", "part1"} and set(ex.companion_parts["onnxruntime-cpu (QDQ)"]) == set(ex.parts)
    chained = execute(comp, dataclasses.replace(ex, parts=None, companion_parts={}), ref, 5, QUIET)
    Tracked.live = Tracked.peak = 0
    track = {n: (lambda f=f: Tracked(f())) for n, f in ex.parts.items()}
    ctrack = {c: {n: (lambda f=f: Tracked(f())) for n, f in p.items()} for c, p in ex.companion_parts.items()}
    got = execute(comp, dataclasses.replace(ex, parts=track, companion_parts=ctrack), ref, 5, QUIET)
    assert json.dumps(got, sort_keys=True) == json.dumps(chained, sort_keys=True) and Tracked.peak == 1
    assert got["parity"]["steps"] == 5 and set(got["three_way"]) >= {"fp32 vs onnxruntime-cpu (QDQ)"}
    assert by["qnn_context"].parity["outputs"]["logits"]["snr_db"] == pytest.approx(
        got["parity"]["outputs"]["logits"]["snr_db"], abs=1e-3)  # the pipeline's own run, one part at a time


@pytest.mark.slow
def test_cpu_qdq_parts_fold_their_weights_alone_and_give_the_unfolded_chains_figures(tmp_path, monkeypatch):
    """A tiny Spark w8a16 decode step in two parts, as if its weight files were full-size (every file over the fold
    limit): one part's session at a time dequantizes its weights once (``ort_cpu(alone=True)``), the whole chain on
    every call, and the figures are the unfolded chain's bit for bit."""
    from omni_export.artifacts.store import Store
    from omni_export.exporters import shelved
    from omni_export.pipeline import Pipeline
    from omni_export.recipes import Build, load_recipe
    from omni_export.runtimes import ort as ort_rt
    r = load_recipe("spark_w8a16").with_overrides(parts=2)
    r = dataclasses.replace(r, builds=(Build("onnx", "fp32"), Build("qdq_onnx", "w8a16")),
                            components=("decode_step",), options={"decode_step": {"parts": 2}}, presets={})
    pipe = Pipeline(r, Store(tmp_path / "store"), QUIET)
    by = {a.target: a for a in pipe.run().artifacts}
    comp, plan = pipe.components["decode_step"], pipe.check()
    ref = comp.reference(plan.par_prompts, {"max_prompt_tokens": r.prompts.max_prompt_tokens, "new_tokens": r.parity.new_tokens})
    monkeypatch.setattr(ort_rt, "FOLD_WEIGHTS_MAX_BYTES", 0)
    folds, session = [], ort_rt.cpu_session
    monkeypatch.setattr(ort_rt, "cpu_session", lambda path, fold_weights=False: folds.append(fold_weights) or session(
        path, fold_weights=fold_weights))
    ex = get_target("qdq_onnx").execution(shelved(by["qdq_onnx"]), comp, None)
    assert set(ex.parts) == {"part0", "part1"}
    chained = execute(comp, dataclasses.replace(ex, parts=None), ref, None, QUIET)
    assert folds == [False, False]  # the chain's two sessions, made at their first call
    folds.clear()
    ex = get_target("qdq_onnx").execution(shelved(by["qdq_onnx"]), comp, None)
    got = execute(comp, ex, ref, None, QUIET)
    assert folds[:2] == [True, True] and all(not f for f in folds[2:])  # parts alone; the chain for a free run only
    assert json.dumps(got, sort_keys=True) == json.dumps(chained, sort_keys=True)
    assert by["qdq_onnx"].parity["outputs"]["logits"]["snr_db"] == pytest.approx(
        got["parity"]["outputs"]["logits"]["snr_db"], abs=1e-3)
