"""Adreno GPU target: the fp32 and fp16 ONNX graphs run on ORT CPU as a local stand-in; the figures go into the
manifest, the verdict stays ``unverified`` on target (a local failure blocks)."""
import json

import pytest

from omni_export.artifacts.store import Store
from omni_export.parity import gate
from omni_export.pipeline import Pipeline


@pytest.mark.slow  # a whole recipe through the pipeline
def test_adreno_graphs_are_measured_locally_but_unverified_on_target(small_recipe, tmp_path):
    res = Pipeline(small_recipe("spark_adreno"), Store(tmp_path)).run()
    arts = {a.scheme: a for a in res.artifacts}
    assert set(arts) == {"fp32", "fp16"}
    for scheme, a in arts.items():
        assert a.status == gate.UNVERIFIED and a.runtime.startswith("onnxruntime-cpu")
        assert "unverified on target" in a.reasons[0]
        m = json.loads((a.shelf_dir / "manifest.json").read_text())
        assert m["verdict"]["local_status"] == "pass" and m["verdict"]["checks"]  # the local figures are kept
        assert all(c["ok"] for c in m["verdict"]["checks"])
        assert m["artifact"]["export"]["precision"] == scheme and (a.shelf_dir / "model.onnx").exists()
    assert arts["fp32"].parity["outputs"]["logits"]["snr_db"] >= 100
    assert 45 <= arts["fp16"].parity["outputs"]["logits"]["snr_db"] < 100  # really fp16, and faithful
    weights = {k: (a.shelf_dir / "model.onnx.data").stat().st_size for k, a in arts.items()}
    assert weights["fp16"] < 0.55 * weights["fp32"]  # fp16 weights in the file that ships
    assert res.exit_code == 0 and not (tmp_path / "published").exists()


def test_off_target_blocks_a_local_failure_and_never_passes():
    th = [gate.Threshold("snr_db", "logits", min=45, reason="a bar with a written reason")]
    good = gate.judge({"outputs": {"logits": {"snr_db": 60.0}}}, th, ["logits"])
    bad = gate.judge({"outputs": {"logits": {"snr_db": 3.0}}}, th, ["logits"])
    assert gate.off_target(good, "stand-in")["status"] == gate.UNVERIFIED
    v = gate.off_target(bad, "stand-in")
    assert v["status"] == gate.BLOCKED and "measured locally: stand-in" in v["reasons"][0]
