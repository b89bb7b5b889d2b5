"""Target ``onnx_genai``: the GenAI-form bundle runs in onnxruntime-genai itself and reproduces eager fp32, at
positions past the sliding window too; a bundle whose genai_config disagrees with its graph is refused."""
import json
import shutil
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
import yaml

from omni_export.artifacts.store import Store
from omni_export.components.decoder_lm import reference_logits
from omni_export.exporters import onnx_genai as ogx
from omni_export.parity import gate
from omni_export.pipeline import Pipeline
from omni_export.recipes import parse_recipe

og = pytest.importorskip("onnxruntime_genai")


def small(small_ckpt, builds, thresholds=None):
    """spark_executorch's thresholds (+ ``thresholds``) over the two-layer checkpoint (window 8), context 32, with
    ``builds``."""
    d = yaml.safe_load(resources.files("omni_export.recipes").joinpath("spark_executorch.yaml").read_text())
    d.update(model={"family": "spark", "preset": None, "seed": 0, "checkpoint": str(small_ckpt)}, context=32,
             prompts={**d["prompts"], "max_prompt_tokens": 12}, parity={"new_tokens": 12}, builds=builds)
    d["thresholds"].update(thresholds or {})
    return parse_recipe(d, "spark_executorch (two-layer test checkpoint)")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("genai")


@pytest.fixture(scope="module")
def run(small_ckpt, root):
    p = Pipeline(small(small_ckpt, [{"target": "onnx_genai", "scheme": "fp32"}]), Store(root))
    res = p.run()
    (a,) = res.artifacts
    return p, a, root / "published" / p.recipe.name / a.artifact_id


def test_genai_bundle_passes_the_gate_with_greedy_ids_from_genai(run):
    p, a, shelf = run
    assert a.status == gate.PASS, a.reasons
    assert {f.name for f in shelf.iterdir()} == {"model.onnx", "model.onnx.data", "genai_config.json",
                                                 "tokenizer.json", "tokenizer_config.json", "manifest.json"}
    m = json.loads((shelf / "manifest.json").read_text())
    assert m["parity"]["runtime"].startswith("onnxruntime-genai Generator")
    lm, g = a.parity["lm"], a.parity["generator"]
    assert lm["greedy_agreement"] == 1.0 and lm["greedy_ids"] == lm["fp32_greedy_ids"]
    assert g["refused"] is None and g["positions"] > 0 and g["logits_snr_db"] >= 100  # GenAI's own logits
    # every output (the new K/V rows too) measured on ORT CPU under the decode step's host loop
    assert set(a.parity["outputs"]) == {s.name for s in p.components["decode_step"].output_specs()}
    assert min(o["snr_db"] for o in a.parity["outputs"].values()) >= 100
    assert m["parity"]["asked_steps"] == a.parity["steps"]
    # the graph names no file of the machine it was exported on: the exporter's stack traces are stripped
    blob = (shelf / "model.onnx").read_bytes()
    assert b"stack_trace" not in blob and str(Path(ogx.__file__).parents[2]).encode() not in blob


def test_genai_tokenizer_gives_the_reference_ids(run):
    """GenAI's tokenizer (onnxruntime-extensions) encodes the text; it does not put the BOS id first, which the
    bundle records (``bos_prepended_by_caller``) and genai_config names (``bos_token_id``)."""
    p, a, shelf = run
    info = json.loads((shelf / "manifest.json").read_text())["artifact"]["export"]
    bos = json.loads((shelf / ogx.CONFIG).read_text())["model"]["bos_token_id"]
    assert info["bos_prepended_by_caller"] and bos == 1
    tok = og.Tokenizer(og.Model(str(shelf)))
    for text in ("Hello there, how are you?", "a b  c"):
        assert [bos] + [int(i) for i in tok.encode(text)] == p.bundle.tokenizer.encode(text)


def test_prefill_past_the_sliding_window_matches_the_uncached_reference(run):
    """One call over 26 rows (window 8): every row's logits and the present rows against the uncached reference."""
    from omni_export.runtimes.ort import cpu_session

    p, a, shelf = run
    cfg = p.bundle.config
    toks = [1] + list(range(40, 65))
    ref = reference_logits(p.bundle.module, toks)
    sess = cpu_session(shelf / "model.onnx")
    S = len(toks)
    feed = {"input_ids": np.array([toks], np.int64), "attention_mask": np.ones((1, S), np.int64),
            "position_ids": np.arange(S, dtype=np.int64)[None]}
    for i in range(cfg.num_hidden_layers):
        for kv in ("key", "value"):
            feed[f"past_key_values.{i}.{kv}"] = np.zeros((1, cfg.num_key_value_heads, 0, cfg.head_dim), np.float32)
    (logits,) = sess.run(["logits"], feed)
    assert S > 3 * cfg.sliding_window
    np.testing.assert_allclose(logits[0], ref, rtol=0, atol=2e-4 * np.abs(ref).max())


def test_a_config_that_disagrees_with_the_graph_is_refused_before_genai(run, tmp_path):
    p, a, shelf = run
    info = json.loads((shelf / "manifest.json").read_text())["artifact"]["export"]
    assert ogx.bundle_problems(shelf, info) == []
    bad = tmp_path / "bad"
    shutil.copytree(shelf, bad)
    conf = json.loads((bad / ogx.CONFIG).read_text())
    conf["model"]["decoder"]["num_key_value_heads"] += 1
    conf["model"]["context_length"] *= 2
    (bad / ogx.CONFIG).write_text(json.dumps(conf))
    problems = ogx.bundle_problems(bad, info)
    assert any("num_key_value_heads" in s for s in problems) and any("context_length" in s for s in problems)
    out = ogx.genai_generate(bad, info, [[1, 40, 41]], [4])
    assert out["ids"] == [[]] and "num_key_value_heads" in out["refused"]


def passed_quantized(small_ckpt, root, scheme: str):
    """``(pipeline, artifact, shelf, manifest)`` of the two-layer checkpoint's GenAI bundle in ``scheme`` under a
    30 dB logits bar (the fp32 bundle it quantizes is the ``run`` fixture's, in the same store), checked published."""
    bars = [{"metric": "snr_db", "outputs": "logits", "min": 30, "reason": f"test bar: {scheme}, 2 layers"}]
    recipe = small(small_ckpt, [{"target": "onnx_genai", "scheme": scheme}], {scheme: bars})
    p = Pipeline(recipe, Store(root))
    (a,) = p.run().artifacts
    assert a.status == gate.PASS, a.reasons
    shelf = root / "published" / recipe.name / a.artifact_id
    return p, a, shelf, json.loads((shelf / "manifest.json").read_text())


def test_w8_block32_bundle_quantizes_every_constant_weight_and_runs_in_genai(small_ckpt, root, run):
    """``w8_block32``: the fp32 bundle's graph (its build reused, not exported again) with every projection as
    onnxruntime's ``MatMulNBits`` (int8, blocks of 32); the manifest names each quantized module and each MatMul left
    fp32 (attention's two, whose second input is computed); GenAI generates with it and the gate judges it."""
    import onnx

    p, a, shelf, m = passed_quantized(small_ckpt, root, "w8_block32")
    w, L = m["artifact"]["export"]["weights"], p.bundle.config.num_hidden_layers
    assert (w["op"], w["bits"], w["block_size"], w["accuracy_level"]) == ("MatMulNBits", 8, 32, 1)
    mods = w["quantized"]["modules"]
    assert w["quantized"]["count"] == len(mods) and "layers.0.mlp.down_proj" in mods
    assert {f"layers.{i}.self_attn" for i in range(L)} <= set(w["float"]["modules"])
    graph = onnx.load(str(shelf / "model.onnx"), load_external_data=False).graph
    nbits = [n for n in graph.node if n.op_type == "MatMulNBits"]
    assert len(nbits) == w["quantized"]["count"] >= 6 * L  # the projections of every layer (Spark fuses q, k, v)
    assert all({at.name: at.i for at in n.attribute}["bits"] == 8 for n in nbits)
    assert not [n for n in graph.node if n.op_type == "MatMul" and n.input[1] in {t.name for t in graph.initializer}]
    fp32_shelf = run[2]
    assert (shelf / "model.onnx.data").stat().st_size < 0.5 * (fp32_shelf / "model.onnx.data").stat().st_size
    g = a.parity["generator"]  # GenAI's own run over the quantized bundle
    assert g["refused"] is None and g["positions"] > 0 and g["logits_snr_db"] >= 30
    assert m["scheme"]["name"] == "w8_block32" and m["scheme"]["activations"] == "fp32"


def test_w8a16_bundle_is_the_qdq_graph_calibrated_on_genais_own_calls(small_ckpt, root, run):
    """``w8a16``: the fp32 bundle's graph (reused, not exported again) as a QDQ graph under the decoder's GenAI policy
    (int16 down/v/head weights, int8 elsewhere, residual Adds and RMSNorms float), calibrated on GenAI's calls over
    the calibration prompts (each prompt in one call, the sink row included); each present is written in the
    encoding its past is read with, int16 symmetric; GenAI generates with it and the gate judges it."""
    import onnx

    p, a, shelf, m = passed_quantized(small_ckpt, root, "w8a16")
    q = m["artifact"]["export"]["quantization"]
    pol, L = q["component_policy"]["genai"], p.bundle.config.num_hidden_layers
    assert pol["policy"] == "decoder w8a16: GenAI decoder" and "lm_head.conv.weight" in pol["int16_weights"]
    assert f"layers.{L - 1}.mlp.down_proj.conv.weight" in pol["int16_weights"]
    assert q["float_nodes"] == len(pol["float_nodes"]) >= 2 * L  # each layer's residual Adds and RMSNorms
    assert "spark_calibration" in q["activation_ranges"] and pol["calibration_pass"]["samples"] > 8
    enc = q["io_encodings"]
    for i in range(L):
        for kv in ("key", "value"):
            past, present = enc[f"past_key_values.{i}.{kv}"], enc[f"present.{i}.{kv}"]
            assert past == present and past["type"] == "int16" and past["zero_point"] == 0
    graph = onnx.load(str(shelf / "model.onnx"), load_external_data=False).graph
    assert [n.input[0] for n in graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "input_ids"] == []
    ops = {n.op_type for n in graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Conv", "SimplifiedLayerNormalization"} <= ops
    assert (shelf / "model.onnx.data").stat().st_size < 0.6 * (run[2] / "model.onnx.data").stat().st_size
    g = a.parity["generator"]  # GenAI's own run over the QDQ bundle
    assert g["refused"] is None and g["positions"] > 0 and g["logits_snr_db"] >= 30
    assert a.parity["lm"]["greedy_agreement"] is not None
