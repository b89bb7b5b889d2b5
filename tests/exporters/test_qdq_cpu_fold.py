"""CPU-QDQ parity with the weights dequantized once (``runtimes.ort.cpu_session(fold_weights=True)``): every output of
the shipped QDQ graph bit-identical to onnxruntime's default QDQ-aware session, on the calibration inputs the graph
was quantized with; a weight file over the limit keeps the default session. The trained SmolLM2 decode step is
checked the same way in ``tests/families/llama/test_llama_recipe.py``."""
import json

import numpy as np
import pytest

from omni_export.artifacts.store import Store
from omni_export.pipeline import Pipeline
from omni_export.runtimes import ort as ort_rt

from qdq_fold import assert_fold_is_exact


def test_folded_qdq_session_gives_the_default_sessions_outputs_exactly(small_recipe, tmp_path):
    recipe = small_recipe("spark_w8a16", builds=[{"target": "qdq_onnx", "scheme": "w8a16"}],
                           options={"prefill": {"rows": 4, "prompt_tokens": 12}}, presets={})
    store = Store(tmp_path)
    pipe = Pipeline(recipe, store)
    res = pipe.run()
    assert {a.artifact_id for a in res.artifacts} == {"decode_step.w8a16.qdq_onnx", "prefill.w8a16.qdq_onnx"}
    for a in res.artifacts:
        cs = pipe.calibs[a.artifact_id.split(".")[0]]
        feeds = [f for _, f in zip(range(6), cs)]  # one graph a component here: its feeds are the graph's
        files = json.loads((a.shelf_dir / "manifest.json").read_text())["artifact"]["files"]
        (model,) = [a.shelf_dir / f for f in files if f.endswith(".onnx")]
        assert assert_fold_is_exact(model, feeds) >= 3  # logits and the new K/V rows


def test_only_small_weight_files_are_folded(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(ort_rt, "cpu_session", lambda path, fold_weights=False: seen.append(fold_weights))
    monkeypatch.setattr(ort_rt, "_runner", lambda sess, names: None)
    (tmp_path / "m.onnx").write_bytes(b"x" * 10)
    (tmp_path / "m.onnx.data").write_bytes(b"x" * 100)
    ort_rt.ort_cpu(tmp_path / "m.onnx", ["y"], qdq=True)
    monkeypatch.setattr(ort_rt, "FOLD_WEIGHTS_MAX_BYTES", 100)
    ort_rt.ort_cpu(tmp_path / "m.onnx", ["y"], qdq=True)
    ort_rt.ort_cpu(tmp_path / "m.onnx", ["y"])  # an fp32 graph keeps the default session
    assert seen == [True, False, False]


def test_graphs_with_float_nodes_keep_the_default_session():
    """Where the QDQ graph leaves float nodes (fp16 islands), onnxruntime's default session fuses across them and the
    basic level does not (measured: the SmolLM2 prefill's logits 0.056 apart), so those graphs are never folded."""
    from types import SimpleNamespace

    from omni_export.exporters.base import foldable

    built = SimpleNamespace(info={"float_nodes": {"prefill": 122}})
    assert not foldable(built, "prefill") and foldable(built, "decode_step")
    assert foldable(SimpleNamespace(info={}), "decode_step")


class _Session:
    def __init__(self, out, calls):
        self.out, self.calls = out, calls

    def run(self, names, feed):
        self.calls.append(self)
        return [np.full(2, self.out(feed["x"]), np.float32) for _ in names]


@pytest.mark.parametrize("exact", [True, False])
def test_a_graph_with_float_nodes_is_folded_only_after_matching_the_default_session(monkeypatch, exact):
    """``verified_fold``: both sessions run the first calls and the default session's outputs are returned; then the
    folded session serves alone if it gave the same bits, else the default session does."""
    calls = []
    default = _Session(lambda x: x.sum(), calls)
    folded = _Session(lambda x: x.sum() + (0.0 if exact else 0.25), calls)
    monkeypatch.setattr(ort_rt, "cpu_session", lambda path, fold_weights=False: folded if fold_weights else default)
    run = ort_rt.verified_fold("m.onnx", ["y", "k"], calls=2)
    for i in range(5):
        (y, _) = run({"x": np.full(3, i, np.float32)})
        assert y[0] == 3 * i  # the default session's figure while checking, the same figure after
    # exact: both run the 2 checked calls, then the folded one alone; not exact: it is dropped at the first mismatch
    assert calls == ([default, folded] * 2 + [folded] * 3 if exact else [default, folded] + [default] * 4)
    assert run.verified["chosen"] is (folded if exact else default) and "sessions" not in run.verified
