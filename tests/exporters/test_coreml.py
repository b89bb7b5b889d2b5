"""CoreML target: .mlpackage directories (fp16, int8 weights) that are hashed and shelved like files; on Linux they are
``unverified`` with the reason, on macOS ``MLModel.predict`` runs them under the same parity code and gate."""
import json
import sys

import pytest

from omni_export.artifacts.hashing import hash_file, path_bytes
from omni_export.artifacts.store import Store
from omni_export.parity import gate
from omni_export.pipeline import Pipeline


@pytest.mark.slow  # a whole recipe through the pipeline
def test_mlpackages_are_shelved_unverified_on_linux(small_recipe, tmp_path):
    if sys.platform == "darwin":
        pytest.skip("on macOS the artifacts are gated: test_coreml_is_gated_on_macos")
    res = Pipeline(small_recipe("spark_coreml"), Store(tmp_path)).run()
    arts = {a.scheme: a for a in res.artifacts}
    assert set(arts) == {"fp16", "w8_fp16"} and res.exit_code == 0
    for a in arts.values():
        assert a.status == gate.UNVERIFIED and a.runtime is None and "needs macOS" in a.reasons[0]
        pkg = a.shelf_dir / "model.mlpackage"
        assert (pkg / "Manifest.json").exists()
        m = json.loads((a.shelf_dir / "manifest.json").read_text())
        f = m["artifact"]["files"]["model.mlpackage"]
        assert f["sha256"] == hash_file(pkg) and f["bytes"] == path_bytes(pkg) > 0
        assert m["artifact"]["export"]["minimum_deployment_target"] == "iOS17"
        assert m["verdict"]["status"] == "unverified" and m["parity"]["metrics"] is None
    assert not (tmp_path / "published").exists()
    assert arts["w8_fp16"].size_bytes < 0.7 * arts["fp16"].size_bytes  # int8 weights


def test_directory_hash_covers_every_file(tmp_path):
    d = tmp_path / "x.mlpackage"
    (d / "Data").mkdir(parents=True)
    (d / "Data" / "w.bin").write_bytes(b"\x00" * 8)
    before = hash_file(d)
    (d / "Data" / "w.bin").write_bytes(b"\x01" * 8)
    assert hash_file(d) != before and path_bytes(d) == 8


@pytest.mark.macos
@pytest.mark.skipif(sys.platform != "darwin", reason="CoreML prediction needs macOS")
def test_coreml_is_gated_on_macos(small_recipe, tmp_path):
    res = Pipeline(small_recipe("spark_coreml"), Store(tmp_path)).run()
    for a in res.artifacts:
        assert a.runtime.startswith("coreml") and a.parity is not None
        assert a.status in (gate.PASS, gate.BLOCKED)  # gated on the measured figures, never unverified here
    fp16 = next(a for a in res.artifacts if a.scheme == "fp16")
    assert fp16.status == gate.PASS and fp16.parity["outputs"]["logits"]["snr_db"] >= 45
