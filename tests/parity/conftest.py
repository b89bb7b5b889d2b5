"""One real store for the gate and report tests: spark_fp16 on the tiny preset (fp32 ONNX on ORT CPU + an HTP fp16
context binary on the QNN HTP simulator, 20 simulator steps), built once per test session (~30 s)."""
import pytest

from omni_export.cli import main
from omni_export.errors import EXIT_OK


@pytest.fixture(scope="session")
def fp16_store(tmp_path_factory):
    store = tmp_path_factory.mktemp("fp16_store")
    assert main(["recipe", "spark_fp16", "--store", str(store), "--simulator-steps", "20"]) == EXIT_OK
    return store
