"""The Gemma 3 w8a16 recipes: ``gemma3_w8a16`` (decode step + AR-N prefill) and ``gemma3_sweep`` (the naive schemes
the gate must block). The trained model's full runs are recorded benchmarks (``benchmarks/gemma3_w8a16_study.py``,
docs/parity.md "Trained weights: Gemma 3 270M"); here: the recipes load with the study's choices and bars, and a
short build of the recipe's decode step on the seeded tiny Gemma 3 records those choices in its manifest."""
import json
from pathlib import Path

import pytest
import yaml

from omni_export import recipes
from omni_export.commands.cli import main
from omni_export.recipes import load_recipe, shipped
from omni_export.commands.sweep import schemes_for, sweep_thresholds

BARS = {  # component/scheme -> metric -> (min, max): the study's bars (docs/parity.md)
    "w8a16": {"snr_db": (30, None), "kld_mean": (None, 2.5e-3), "kld_p99": (None, 2.0e-2), "top1_agreement": (0.96, None)},
    "prefill/w8a16": {"snr_db": (28, None), "kld_mean": (None, 2.5e-3), "kld_p99": (None, 2.0e-2),
                      "top1_agreement": (0.93, None)},
}


def bars(recipe, key: str) -> dict:
    out = {}
    for t in recipe.thresholds[key]:
        out.setdefault(t.metric, []).append((t.outputs, t.min, t.max))
    return out


def test_recipe_carries_the_study_choices_and_bars():
    r = load_recipe("gemma3_w8a16")
    assert "gemma3_w8a16" in shipped() and r.model.family == "gemma3" and r.model.checkpoint.startswith("pkg:")
    assert r.components == ("decode_step", "prefill") and r.context == 640
    assert {(b.target, b.scheme) for b in r.builds} == {("onnx", "fp32"), ("qdq_onnx", "w8a16"),
                                                         ("qnn_context", "w8a16"), ("executorch", "fp32")}
    # the study's choices: the stream at 2^-3 in both components (fp16 islands need it), the decode step's residual
    # Adds and RMSNorms float (the prefill's policy floats them already)
    assert r.options["decode_step"] == {"residual_scale": 0.125, "float_residual": True, "parity_from": 528}
    assert r.options["prefill"]["residual_scale"] == 0.125
    for key, want in BARS.items():
        got = bars(r, key)
        for metric, (lo, hi) in want.items():
            assert any((t_lo, t_hi) == (lo, hi) for _, t_lo, t_hi in got[metric]), (key, metric, got[metric])
        logits = [lo for out, lo, _ in got["snr_db"] if out == "logits"]
        assert logits and all(lo >= 28 for lo in logits)
    for ths in r.thresholds.values():  # every bar names the figure it comes from
        assert all(any(c.isdigit() for c in t.reason) for t in ths)


def test_sweep_holds_every_quantized_scheme_to_the_study_bar():
    r = load_recipe("gemma3_sweep")
    assert schemes_for(r, None) == ("fp16", "w8a16", "w8a16_naive", "w8a8", "w4a16_uncalibrated")
    shipped_step = load_recipe("gemma3_w8a16").options["decode_step"]  # at the study's context 128: no parity_from
    assert r.options["decode_step"] == {k: v for k, v in shipped_step.items() if k != "parity_from"}
    w8a16 = {(t.metric, t.outputs, t.min, t.max) for t in load_recipe("gemma3_w8a16").thresholds["w8a16"]}
    for s in ("w8a16", "w8a16_naive", "w8a8", "w4a16_uncalibrated"):
        th, src = sweep_thresholds(r, "decode_step", s)
        assert src in ("w8a16", "w8a16 (inherited)") and {(t.metric, t.outputs, t.min, t.max) for t in th} == w8a16
    th, src = sweep_thresholds(r, "decode_step", "fp16")
    assert src == "fp16" and min(t.min for t in th if t.metric == "snr_db" and t.outputs == "logits") == 36


@pytest.mark.slow  # a tiny recipe run: 61 s on 2 shared, loaded cores
def test_short_build_records_the_float_islands_and_the_stream_scale(tmp_path):
    """The recipe's decode step (its options, policy and bars) built w8a16 on the seeded tiny Gemma 3 with a short
    calibration: the manifest records the fp16 islands (every RMSNorm and residual Add, 8 per layer + the final
    norm), the residual stream's scale and the sink rule of the calibration."""
    d = yaml.safe_load((Path(recipes.__file__).parent / "gemma3_w8a16.yaml").read_text())
    d.update(name="g3_short", components=["decode_step"], builds=[{"target": "qdq_onnx", "scheme": "w8a16"}],
             model={"family": "gemma3", "preset": "tiny", "seed": 3}, context=128,
             prompts={**d["prompts"], "max_prompt_tokens": 12}, calibration={"max_samples": 32, "new_tokens": 4},
             parity={"new_tokens": 4, "max_prompts": 1})
    d["options"] = {"decode_step": {k: v for k, v in d["options"]["decode_step"].items() if k != "parity_from"}}
    d["thresholds"] = {"w8a16": d["thresholds"]["w8a16"]}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(d))
    main(["recipe", str(tmp_path / "r.yaml"), "--store", str(tmp_path / "s")])
    found = sorted((tmp_path / "s").glob("*/g3_short/decode_step.w8a16.qdq_onnx/manifest.json"))
    assert len(found) == 1
    m = json.loads(found[0].read_text())
    export = m["artifact"]["export"]
    policy = export["component_policy"]["model"]
    layers = m["model"]["config"]["num_hidden_layers"]
    assert "fp16_islands" in policy and export["float_nodes"] == {"model": 8 * layers + 1}
    assert len(policy["float_nodes"]) == 8 * layers + 1
    assert m["artifact"]["component"]["graph_rewrite"]["residual_scale"] == 0.125
    assert m["calibration"]["excluded"]["attention_sinks"]["rule"].startswith("position 0")
    assert m["parity"]["metrics"]["outputs"]["logits"]["snr_db"] > 20  # it ran, and the islands kept it sane


@pytest.mark.slow  # reads the trained checkpoint's tokenizer
@pytest.mark.parametrize("name", ["gemma3_w8a16", "gemma3_fp16"])
def test_the_gemma3_recipes_execute_past_the_window(name):
    """``gemma3_w8a16`` and ``gemma3_fp16`` at context 640: every executed decode-step position (``parity_from`` on,
    the HTP's 16 steps included) lies past the 512-token window plus 16, the prefill takes the whole held-out passage
    (on the simulator too), and a calibrated scheme's calibration passages reach past the window (a calibration that
    stops at position ~72 is what the long parity measures blocked: docs/parity.md)."""
    from omni_export.families import load_prompt_set
    from omni_export.families.gemma3.checkpoint import tokenizer as gemma_tokenizer

    r = load_recipe(name)
    assert r.context == 640 and r.options["decode_step"]["residual_scale"] == 0.125
    assert ("executorch", "fp32", ("decode_step",)) in {(b.target, b.scheme, b.components) for b in r.builds}
    start, window = r.options["decode_step"]["parity_from"], 512
    assert start >= window + 16
    tok = gemma_tokenizer(None, r.model.checkpoint)  # the GGUF's own, rebuilt
    parity = [len(tok.encode(p, r.prompts.max_prompt_tokens)) for p in load_prompt_set(r.prompts.parity).prompts]
    assert min(parity) > start and max(parity) + r.parity.new_tokens <= r.context
    pre = r.options["prefill"]  # the prefill takes the whole passage, on the simulator too (128-row calls)
    assert pre["prompt_tokens"] >= max(parity) and pre["simulator_calls"] * 128 >= max(parity)
    held_out = set(load_prompt_set("gemma3_calibration").prompts) | set(load_prompt_set(r.prompts.calibration).prompts)
    assert not held_out & set(load_prompt_set(r.prompts.parity).prompts)
    if any(b.scheme == "w8a16" for b in r.builds):
        calib = [len(tok.encode(p, r.prompts.max_prompt_tokens))
                 for p in load_prompt_set(r.prompts.calibration).prompts]
        assert max(calib) > window and max(calib) + r.calibration.new_tokens <= r.context
    else:  # fp16's top-1 bar has no min_positions: the HTP's steps reach generated positions
        assert start + r.parity.simulator_steps > max(parity)


@pytest.mark.slow  # reads the trained checkpoint's tokenizer
def test_the_gemma3_bundles_are_judged_past_the_window_by_the_trained_models_bars():
    """``gemma3_deploy`` (a recorded run: docs/deploy.md): every deployable bundle target of the family, the decode
    step scored from past the window plus 16 on the held-out passage, and each scheme held to the bars the trained
    model's own recipes derived: fp32 and int8 blocks of 32 to ``gemma3_w8a16``'s decode step, fp16 to
    ``gemma3_fp16``'s (the same metrics, outputs and limits)."""
    from omni_export.exporters.genie import max_prompt_tokens, prompt_rows
    from omni_export.families import load_prompt_set
    from omni_export.families.gemma3.checkpoint import tokenizer as gemma_tokenizer

    r, w, f = load_recipe("gemma3_deploy"), load_recipe("gemma3_w8a16"), load_recipe("gemma3_fp16")
    assert {(b.target, b.scheme) for b in r.builds} == {("executorch_llm", "fp32"), ("onnx_genai", "fp32"),
                                                         ("onnx_genai", "w8_block32"), ("genie", "fp16")}
    assert r.components == ("decode_step",)
    assert r.options["decode_step"]["residual_scale"] == 0.125  # fp16 inside Genie needs the scaled stream
    start = r.options["decode_step"]["parity_from"]
    assert start >= 512 + 16
    tok = gemma_tokenizer(None, r.model.checkpoint)
    parity = [len(tok.encode(p, r.prompts.max_prompt_tokens)) for p in load_prompt_set(r.prompts.parity).prompts]
    assert min(parity) > start and max(parity) + r.parity.new_tokens <= r.context
    assert start + r.parity.simulator_steps > max(parity)  # the HTP's steps reach generated positions (fp16's top-1)
    assert max(parity) <= max_prompt_tokens(r.context, prompt_rows(r.context))  # Genie takes the whole passage

    def limits(rec, key):
        return [(t.metric, t.outputs, t.min, t.max, t.min_positions) for t in rec.thresholds[key]]
    assert limits(r, "fp32") == limits(w, "fp32") and limits(r, "fp16") == limits(f, "fp16")
    assert limits(r, "w8_block32") == limits(w, "w8a16")
