"""CPU-QDQ parity with the weights dequantized once (``runtimes.ort.cpu_session(fold_weights=True)``): every output of
the shipped QDQ graph bit-identical to onnxruntime's default QDQ-aware session, on the calibration inputs the graph
was quantized with; a weight file over the limit keeps the default session. The trained SmolLM2 decode step is
checked the same way in ``tests/families/llama/test_llama_recipe.py``."""
import json

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
