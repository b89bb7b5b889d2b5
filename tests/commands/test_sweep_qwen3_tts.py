"""``omni-export sweep`` on the tiny Qwen3-TTS preset: every component, calibrated w8a16 passes on CPU-QDQ and beats
the broken scheme (uncalibrated int4) everywhere, which the gate blocks (from its measured figures) and never
publishes.

Calibrated against uncalibrated w8a16 (random stand-in ranges) is swept on Spark (``tests/commands/test_sweep.py``), where it
is measured on every row; here it would be four more exports and parities for no claim of its own.

Fewer runtimes, the same claims: fp16 is not swept here because every component's fp16 context binary is already
executed on the HTP simulator and must pass in ``tests/recipes/test_qwen3_tts_recipes.py`` (``qwen3_tts_fp16``), and
the simulator's fp16 Code2Wav chunks were most of this test's time. A sweep's fp16 row on the simulator is asserted
on Spark (``tests/commands/test_sweep.py``).

int8 activations are not in this sweep: since the fused RMSNorm the tiny seeded talker's w8a8 build meets the w8a16
bar (seeded random weights lack the outliers that break int8 activations), so on this model the gate has nothing
to block there. The gate's block of w8a8 is asserted on ``spark_w8a8`` (``tests/test_exit_codes.py``) and measured
on the trained SmolLM2 in the recorded sweep (docs/parity.md: 0.2-9.8 dB).

The sweep is the shipped ``qwen3_tts_sweep`` made small as the recipe tests make theirs (``qwen3_small``: the one
parity prompt, the shipped builds, calibration and thresholds), so its calibrated w8a16 rows are the
``qwen3_tts_w8a16`` recipe test's files measured on the same prompt: their parity is a finished step of that store,
reused here, and only the uncalibrated int4 scheme is built and executed.

Slow: two schemes x four components gated, one of them exported and executed on ORT CPU here.
"""
import json
import shutil

import pytest
import yaml

from qwen3_small import small_recipe

from omni_export.commands.cli import main
from omni_export.errors import EXIT_OK

pytestmark = pytest.mark.slow

COMPONENTS = ("talker_step", "code_predictor_step", "code2wav_first", "code2wav")
SCHEMES = "w8a16,w4a16_uncalibrated"


def test_qwen3_tts_sweep_gates_every_component(tmp_path, capsys, shared_store, tmp_path_factory):
    # the calibration sets, fp32 exports, calibrated w8a16 builds and their parity on the one prompt are the
    # qwen3_tts_w8a16 recipe test's (the same model, calibration, component options and parity prompt): start from
    # that shared store's step cache, as a user's second run would
    seed = shared_store(small_recipe("qwen3_tts_w8a16", tmp_path_factory))
    store = tmp_path / "store"
    shutil.copytree(seed.path / "cache", store / "cache", symlinks=True)
    measured = set((store / "cache" / "parity").iterdir())
    recipe = tmp_path / "qwen3_tts_sweep.yaml"
    recipe.write_text(yaml.safe_dump(small_recipe("qwen3_tts_sweep", tmp_path_factory), sort_keys=True))
    assert main(["sweep", str(recipe), "--schemes", SCHEMES, "--no-sensitivity", "--store", str(store)]) == EXIT_OK
    assert "scheme x component" in capsys.readouterr().out
    out = sorted((store / "runs" / "qwen3_tts_sweep-sweep").glob("*/sweep.json"))[-1]
    assert (out.parent / "sweep.md").read_text().startswith("## omni-export sweep `qwen3_tts_sweep`")
    rows = {(r["scheme"], r["component"]): r for r in json.loads(out.read_text())["sweep"]["rows"]}
    assert set(rows) == {(s, c) for s in SCHEMES.split(",") for c in COMPONENTS}
    published = store / "published" / "qwen3_tts_sweep-sweep"
    for c in COMPONENTS:
        cal, r = rows["w8a16", c], rows["w4a16_uncalibrated", c]
        assert cal["status"] == "pass" and cal["runtime"] == "onnxruntime-cpu (QDQ)", cal
        # calibrated ranges beat the broken build on the main output (logits or audio) of every component
        assert cal["logits_snr_db"] > r["logits_snr_db"], (c, cal["logits_snr_db"], r["logits_snr_db"])
        assert r["status"] == "blocked", r
        assert r["thresholds_from"] == "w8a16 (inherited)"
        assert not (published / r["artifact"]).exists()
    # executed here: the uncalibrated int4 scheme on every component; the w8a16 rows' figures are the recipe test's
    assert len(set((store / "cache" / "parity").iterdir()) - measured) == len(COMPONENTS)
