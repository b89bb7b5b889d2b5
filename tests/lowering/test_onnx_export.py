"""The exporter's optimizer speedup (``onnx_export._multi_output_fast_fail``) changes no byte of the exported graph."""
import contextlib
import hashlib

from onnxscript.rewriter._matcher import SimplePatternMatcher

from omni_export.components.decoder_lm import DecodeStepComponent
from omni_export.lowering import onnx_export
from omni_export.lowering.onnx_export import export_onnx


def _digest(path):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.parent.glob(path.name + "*"))}


def test_multi_output_fast_fail_exports_the_same_bytes_and_is_undone(tiny_spark, tmp_path, monkeypatch):
    g = DecodeStepComponent(tiny_spark, 64).graphs()[0]
    original = SimplePatternMatcher.match
    calls = {"fast": 0, "full": 0}

    def counting(self, *a, **kw):  # every match the exporter's optimizer asks, unpatched
        calls["full"] += 1
        return original(self, *a, **kw)

    monkeypatch.setattr(SimplePatternMatcher, "match", counting)
    for d in ("fast", "plain"):
        (tmp_path / d).mkdir()
    fast = export_onnx(g.module, g, tmp_path / "fast" / "model.onnx")
    with_patch = calls["full"]
    monkeypatch.setattr(onnx_export, "_multi_output_fast_fail", contextlib.nullcontext)
    plain = export_onnx(g.module, g, tmp_path / "plain" / "model.onnx")
    without = calls["full"] - with_patch
    assert _digest(fast) == _digest(plain) and len(_digest(fast)) == 2  # graph and weight file, byte for byte
    # the full matcher ran for fewer candidate nodes: multi-output patterns skipped nodes of the wrong op at once
    assert 0 < with_patch < without, (with_patch, without)
    assert SimplePatternMatcher.match is counting  # restored after the export


def test_folded_transposes_written_ahead_give_the_same_bytes(tiny_spark, tmp_path, monkeypatch):
    """``_contiguous_on_write`` makes the next folded transpose contiguous in a second thread while one is written:
    the files are byte for byte those of one tensor at a time (no tensor written ahead), and the strided views it
    replaces are there to replace (the graph has folded transposes)."""
    g = DecodeStepComponent(tiny_spark, 64).graphs()[0]
    made = []
    real = onnx_export.torch.Tensor.contiguous
    monkeypatch.setattr(onnx_export.torch.Tensor, "contiguous", lambda self, *a: made.append(1) or real(self, *a))
    for d in ("ahead", "one"):
        (tmp_path / d).mkdir()
    ahead = export_onnx(g.module, g, tmp_path / "ahead" / "model.onnx")
    assert len(made) >= 4
    monkeypatch.setattr(onnx_export, "PREFETCH_MAX", 0)
    one = export_onnx(g.module, g, tmp_path / "one" / "model.onnx")
    assert _digest(ahead) == _digest(one) and len(_digest(one)) == 2
