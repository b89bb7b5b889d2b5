"""Parts built side by side in worker processes (``lowering.parallel``) give the same files as one at a time, a
worker's error reaches the caller as the same one-line error, and the workers' memory is in the stage's figure."""
import pytest

from omni_export import memory
from omni_export.calibration.dataset import write_set
from omni_export.families import load_prompt_set
from omni_export.components.decoder_lm import DecodeStepComponent
from omni_export.errors import CalibrationError
from omni_export.exporters import ExportRequest, qdq_onnx
from omni_export.lowering.parallel import PartPool
from omni_export.quantize.qdq import quantize_part
from omni_export.schemes import get_scheme


@pytest.fixture(scope="module")
def two_parts(tiny_spark, tmp_path_factory):
    comp = DecodeStepComponent(tiny_spark, 64, parts=2)
    cal, opts = load_prompt_set("spark_calibration"), {"max_prompt_tokens": 8, "new_tokens": 2}
    d = tmp_path_factory.mktemp("cal")
    return comp, write_set(d, comp.calibration_feeds(cal, opts), comp.calibration_steps(cal, opts), 6, cal.name, cal.hash)


def test_parts_in_workers_equal_parts_one_at_a_time(two_parts, tmp_path, monkeypatch):
    comp, samples = two_parts
    out = {}
    for workers in ("1", "2"):
        monkeypatch.setenv("OMNI_EXPORT_PART_WORKERS", workers)
        d = tmp_path / workers
        d.mkdir()
        memory.reset_peak()
        built = qdq_onnx.TARGET.export(ExportRequest(comp, get_scheme("w8a16"), None, samples, None), d)
        if workers == "2":
            assert memory.peak_rss_bytes() > memory.own_peak_rss_bytes()  # the workers' peaks are counted
        out[workers] = {n: (d / f).read_bytes() for n, f in built.files.items()}
        assert not list(d.glob(".fp32-*"))  # each part's fp32 source is removed once quantized
    assert set(out["1"]) == set(out["2"]) == {"part0", "part0.weights", "part1", "part1.weights"}
    for n in out["1"]:
        assert out["1"][n] == out["2"][n], n


def test_a_worker_error_reaches_the_caller(two_parts, tmp_path, monkeypatch):
    comp, _ = two_parts
    monkeypatch.setenv("OMNI_EXPORT_PART_WORKERS", "2")
    g = comp.graphs()[0]
    src = tmp_path / "w" / "src.onnx"
    src.parent.mkdir()
    qdq_onnx.qdq_source(comp, g, get_scheme("w8a16"), src)
    with pytest.raises(CalibrationError, match="calibration stream is empty"):
        with PartPool(2) as pool:
            assert not pool.inline
            pool.submit(quantize_part, src, tmp_path / "q.onnx", [], get_scheme("w8a16"), None, 1.0)
    assert not (tmp_path / "q.onnx").exists()


def test_workers_fit_the_memory_budget_default_6_gib(monkeypatch):
    """Only as many workers as fit beside this process in ``OMNI_EXPORT_MEMORY_GIB`` (default 6: the full-size
    budget of a smaller laptop); an explicit ``OMNI_EXPORT_PART_WORKERS`` is the user's choice."""
    from omni_export.lowering.parallel import part_workers
    monkeypatch.delenv("OMNI_EXPORT_PART_WORKERS", raising=False)
    monkeypatch.delenv("OMNI_EXPORT_MEMORY_GIB", raising=False)
    monkeypatch.setattr(memory, "current_rss_bytes", lambda: 3 * 2**30)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert part_workers(4, int(1.4 * 2**30)) == 2   # 3 GiB of room: two 1.4 GiB jobs
    assert part_workers(4, int(1.9 * 2**30)) == 1   # a full-size compile job: one at a time
    assert part_workers(4, 5 * 2**30) == 1          # never fewer than one
    monkeypatch.setenv("OMNI_EXPORT_MEMORY_GIB", "8")
    assert part_workers(4, int(1.9 * 2**30)) == 2
    monkeypatch.setenv("OMNI_EXPORT_PART_WORKERS", "2")
    monkeypatch.setenv("OMNI_EXPORT_MEMORY_GIB", "6")
    assert part_workers(4, int(1.9 * 2**30)) == 2
    assert part_workers(1, None) == 1
