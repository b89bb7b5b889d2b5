"""``omni-export sweep`` on the tiny Spark preset: every scheme through the one Pipeline, gated, tabulated.

Slow (several minutes: nine schemes, each a real export executed on ORT CPU or the HTP simulator)."""
import dataclasses
import json

import pytest

from omni_export.artifacts.store import Store
from omni_export.commands.cli import main
from omni_export.errors import EXIT_OK
from omni_export.parity.gate import Threshold
from omni_export.recipes import load_recipe
from omni_export.commands.sweep import run_sweep

pytestmark = pytest.mark.slow


def _rows(store):
    out = sorted((store / "runs" / "spark_sweep-sweep").glob("*/sweep.json"))[-1]
    sweep = json.loads(out.read_text())["sweep"]
    assert (out.parent / "sweep.md").read_text().startswith("## omni-export sweep `spark_sweep`")
    return {r["scheme"]: r for r in sweep["rows"]}


def test_sweep_passes_faithful_schemes_and_blocks_broken_ones(tmp_path, capsys):
    store = tmp_path / "store"
    assert main(["sweep", "spark_sweep", "--store", str(store), "--simulator-steps", "24"]) == EXIT_OK
    assert "scheme x component" in capsys.readouterr().out
    rows = _rows(store)
    assert set(rows) == {"fp16", "w8a16", "w8a16_percentile", "w8a16_entropy", "w8a16_uncalibrated", "w4a16",
                         "w4a16_uncalibrated", "w8a8", "w8a16_mixed"}
    assert rows["fp16"]["status"] == "pass" and rows["fp16"]["runtime"].startswith("qnn-htp-simulator")
    assert rows["w8a16"]["status"] == "pass"
    for broken in ("w4a16_uncalibrated", "w8a8"):
        assert rows[broken]["status"] == "blocked", rows[broken]
        assert not (store / "published" / "spark_sweep-sweep" / rows[broken]["artifact"]).exists()
    # calibrated ranges beat random stand-in ranges, on the logits and on the K/V rows
    cal, unc = rows["w8a16"], rows["w8a16_uncalibrated"]
    assert cal["logits_snr_db"] > unc["logits_snr_db"] and cal["kv_min_snr_db"] > unc["kv_min_snr_db"]
    assert rows["w8a16"]["thresholds_from"] == "w8a16" and rows["w8a8"]["thresholds_from"] == "w8a16 (inherited)"
    # plain w8a16 clears the deployable bars on the calibration prompts, so the mixed search raises no weight
    assert rows["w8a16_mixed"]["status"] == "pass" and rows["w8a16_mixed"]["overrides"] == {"model": {}}
    assert all(r["size_bytes"] > 0 for r in rows.values())
    sens = store / "runs" / "spark_sweep-sweep" / "sensitivity"
    assert (sens / "decode_step.model.w8a16.png").read_bytes()[:4] == b"\x89PNG"
    layers = json.loads((sens / "decode_step.model.w8a16.json").read_text())["layers"]
    assert len(layers) == 25 and layers[-1]["layer"] == "lm_head"


def test_mixed_precision_turns_a_blocked_build_into_a_published_one(tmp_path):
    # A consumer that needs 40 dB logits SNR (stricter than the deployable 25 dB): the shipped w8a16 of the tiny
    # decode step measures ~38-39 dB on the parity prompts, so it is blocked; w8a16_mixed (the same policy with more
    # weights at int16) must find weights that clear the bar (+ the selection margin) on the calibration prompts and
    # then pass the gate on the parity prompts.
    r = load_recipe("spark_sweep")
    strict = (Threshold("snr_db", "logits", min=40.0, reason="a stricter consumer: exercises mixed precision"),
              *[t for t in r.thresholds["w8a16"] if t.outputs != "logits" or t.metric != "snr_db"])
    r = dataclasses.replace(r, thresholds={**r.thresholds, "w8a16": strict})
    store = Store(tmp_path / "store")
    sweep = run_sweep(r, store, ("w8a16", "w8a16_mixed"), sensitivity=False)
    rows = {x["scheme"]: x for x in sweep["rows"]}
    assert rows["w8a16"]["status"] == "blocked" and rows["w8a16"]["logits_snr_db"] < 40.0
    mixed = rows["w8a16_mixed"]
    assert mixed["status"] == "pass" and mixed["logits_snr_db"] >= 40.0, mixed
    over = mixed["overrides"]["model"]
    assert 0 < len(over) < 25 and set(over.values()) == {"int16"}
    m = json.loads((store.root / "published" / "spark_sweep-sweep" / mixed["artifact"] / "manifest.json").read_text())
    info = m["artifact"]["export"]["mixed_precision"]["model"]
    assert info["overrides"] == over
    trials = {t["raised"]: t["status"] for t in info["trials"]}
    assert trials[0] == "blocked" and trials[len(over)] == "pass" and trials[len(over) - 1] == "blocked"
