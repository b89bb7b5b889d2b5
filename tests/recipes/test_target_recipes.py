"""The shipped ExecuTorch and CoreML recipes on the tiny preset, through the CLI: gated .pte files, and .mlpackages on
the unverified shelf on Linux."""
import json
import sys

import pytest

from omni_export.commands.cli import main
from omni_export.errors import EXIT_OK

pytestmark = pytest.mark.slow


def test_spark_executorch_gates_pte_files(tmp_path):
    assert main(["recipe", "spark_executorch", "--store", str(tmp_path)]) == EXIT_OK
    rep = json.loads((tmp_path / "runs" / "spark_executorch" / "latest.json").read_text())
    arts = {a["id"]: a for a in rep["artifacts"]}
    for aid in ("decode_step.fp32.executorch", "decode_step.w8a8_dynamic.executorch"):
        assert arts[aid]["status"] == "pass" and arts[aid]["runtime"].startswith("executorch-runtime")
        assert (tmp_path / "published" / "spark_executorch" / aid / "model.pte").exists()
    dyn = arts["decode_step.w8a8_dynamic.executorch"]["parity"]["outputs"]["logits"]["snr_db"]
    assert 25 <= dyn < 100  # really quantized, and above the bar
    coreml = arts["decode_step.fp16.executorch_coreml"]
    if sys.platform != "darwin":
        assert coreml["status"] == "unverified" and "CoreMLBackend" in coreml["reasons"][0]


@pytest.mark.skipif(sys.platform == "darwin", reason="on macOS CoreML artifacts are gated, not unverified")
def test_spark_coreml_lands_on_the_unverified_shelf(tmp_path):
    assert main(["recipe", "spark_coreml", "--store", str(tmp_path)]) == EXIT_OK
    shelf = tmp_path / "unverified" / "spark_coreml"
    for aid in ("decode_step.fp16.coreml", "decode_step.w8_fp16.coreml"):
        assert (shelf / aid / "model.mlpackage" / "Manifest.json").exists()
        assert json.loads((shelf / aid / "manifest.json").read_text())["verdict"]["status"] == "unverified"
    assert not (tmp_path / "published").exists()
