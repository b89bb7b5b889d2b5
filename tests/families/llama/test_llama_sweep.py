"""``omni-export sweep smollm2_sweep`` through the naive all-ops w8a16 (slow; decomposed norms, calibrated on the
attention sinks too, its own calibration set): blocked on the trained weights.

The sweep's other rows on the trained model are a recorded run, not CI (``omni-export sweep smollm2_sweep``, figures
in docs/parity.md): its fp16 row on the HTP simulator (the fp16 sweep row on the simulator is asserted in CI on Spark,
``tests/commands/test_sweep.py``), w8a16 and w8a8 calibrated like the shipped build (the shipped w8a16 build passes in
``test_llama_recipe.py``; int8 activations are blocked in CI on ``spark_w8a8``, ``tests/test_exit_codes.py``) and
its uncalibrated w4a16 (blocked in CI on Spark, Qwen3-TTS and the end-to-end test's ``spark_w4a16_uncalibrated``)."""
import json
from importlib import resources

import pytest
import yaml

from omni_export.commands.cli import main
from omni_export.errors import EXIT_OK

SCHEMES = ("w8a16_naive",)
# CI's cut of the shipped sweep: a naive build is broken at any calibration size, so its own calibration set takes
# 128 steps of 8-token continuations (not 1,024 of 24) and the parity 8 new tokens a prompt (not 52). Measured
# with these settings: -2.3 dB, blocked (the recipe's own settings: -2.7 dB, docs/parity.md).
CI_CUT = {"calibration": {"max_samples": 128, "new_tokens": 8}, "parity": {"new_tokens": 8, "simulator_steps": 16}}


@pytest.mark.slow
def test_smollm2_sweep_blocks_the_naive_all_ops_w8a16(tmp_path):
    data = yaml.safe_load(resources.files("omni_export.recipes").joinpath("smollm2_sweep.yaml").read_text())
    assert data["calibration"]["max_samples"] > CI_CUT["calibration"]["max_samples"]   # a cut, not a change
    recipe = tmp_path / "smollm2_sweep.yaml"
    recipe.write_text(yaml.safe_dump({**data, **CI_CUT}))
    store = tmp_path / "store"
    code = main(["sweep", str(recipe), "--store", str(store), "--schemes", ",".join(SCHEMES), "--no-sensitivity"])
    out = sorted((store / "runs" / "smollm2_sweep-sweep").glob("*/sweep.json"))[-1]
    rows = {r["scheme"]: r for r in json.loads(out.read_text())["sweep"]["rows"]}
    assert set(rows) == set(SCHEMES)
    naive = rows["w8a16_naive"]
    assert naive["status"] == "blocked", naive
    assert naive["logits_snr_db"] < 30  # the trained-weights bar: broken builds measured 2-28 dB
    assert naive["runtime"] == "onnxruntime-cpu (QDQ)"
    assert not (store / "published" / "smollm2_sweep-sweep" / naive["artifact"]).exists()
    assert code == EXIT_OK  # a blocked row is what the sweep found, not a failure of it
