"""Helpers for the store tests: the tiny recipe and ways to look at a store's whole state."""
import json
from importlib import resources

import yaml

W8A16_BAR = [{"metric": "snr_db", "outputs": "logits", "min": 15,
              "reason": "test recipe: 8 calibration samples of 4 tokens put the tiny decode step near 23 dB; 15 dB "
                        "separates that from a broken build (uncalibrated w4a16: about -1.6 dB, docs/parity.md)"}]


def tiny_recipe_data() -> dict:
    d = yaml.safe_load(resources.files("omni_export.recipes").joinpath("spark_w8a16.yaml").read_text())
    d.update(name="tiny_store", components=["decode_step"], context=32, options={}, presets={},
             builds=[{"target": "onnx", "scheme": "fp32"}, {"target": "qdq_onnx", "scheme": "w8a16"}],
             calibration={"max_samples": 8, "new_tokens": 4},
             parity={"new_tokens": 4, "max_prompts": 1, "simulator_steps": 4})
    d["prompts"]["max_prompt_tokens"] = 8
    d["thresholds"] = {"fp32": d["thresholds"]["fp32"], "w8a16": W8A16_BAR}
    return d




def tree(root) -> dict:
    """Every file under ``root`` (but the lock) -> its bytes' sha256: a store's whole state."""
    from omni_export.artifacts.hashing import hash_file
    return {p.relative_to(root).as_posix(): hash_file(p) for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def temporaries(root) -> list:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob(".tmp-*"))


def manifest(store, aid="decode_step.fp32.onnx", shelf="published") -> dict:
    return json.loads((store / shelf / "tiny_store" / aid / "manifest.json").read_text())
