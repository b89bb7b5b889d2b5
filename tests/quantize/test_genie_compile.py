"""``genie_qdq.compile_float_io``: QNN's default graph finalization is tried first; only its allocation failure is
retried, with the fallback mode, which the caller records; any other refusal is raised as it came."""
import pytest

from omni_export.errors import UnsupportedError
from omni_export.quantize import genie_qdq


def fake_session(failures: list[str], calls: list[dict]):
    def htp_session(src, device, fp16=False, context_out=None, provider_options=None):
        calls.append(dict(provider_options))
        if failures:
            context_out.with_name(context_out.stem + "_part.bin").write_bytes(b"half")  # a failed attempt's file
            raise UnsupportedError(f"QNN HTP (SM8750) refused {src.name}: {failures.pop(0)}")
        context_out.write_text("ctx")
    return htp_session


def test_an_allocation_failure_is_finalized_again_in_the_fallback_mode_and_said(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(genie_qdq, "htp_session", fake_session(["Failed to finalize QNN graph. Error: "
                                                                "QNN_COMMON_ERROR_MEM_ALLOC: Memory allocation"], calls))
    note = genie_qdq.compile_float_io(tmp_path / "g.qdq.onnx", None, True, tmp_path / "g_ctx.onnx")
    assert calls == [{"offload_graph_io_quantization": "0"},
                     {"offload_graph_io_quantization": "0", "htp_graph_finalization_optimization_mode": "1"}]
    assert note.startswith("htp_graph_finalization_optimization_mode 1") and "QNN_COMMON_ERROR_MEM_ALLOC" in note
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g_ctx.onnx"]  # nothing of the failed attempt is kept


def test_the_default_finalization_is_kept_where_it_works_and_other_refusals_are_raised(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(genie_qdq, "htp_session", fake_session([], calls))
    assert genie_qdq.compile_float_io(tmp_path / "g.qdq.onnx", None, True, tmp_path / "g_ctx.onnx") is None
    assert calls == [{"offload_graph_io_quantization": "0"}]
    monkeypatch.setattr(genie_qdq, "htp_session", fake_session(["op Foo is not supported"], calls := []))
    with pytest.raises(UnsupportedError, match="op Foo is not supported"):
        genie_qdq.compile_float_io(tmp_path / "h.qdq.onnx", None, True, tmp_path / "h_ctx.onnx")
    assert len(calls) == 1
