"""onnx refuses an external-data ``location`` that exists in the *current* directory (not the model's): a QDQ build
run from a folder holding a file of that name failed. ``artifacts.onnx_external.beside_the_model`` saves the same
bytes wherever the process runs, and onnx's own conversion is back afterwards."""
import hashlib

import numpy as np
import onnx
from onnx import TensorProto, external_data_helper, helper, numpy_helper

from omni_export.artifacts.onnx_external import beside_the_model
from omni_export.quantize.qdq import quantize_qdq
from omni_export.schemes import get_scheme


def _conv_model(path):
    rs = np.random.RandomState(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 1, 4])
    node = helper.make_node("Conv", ["x", "proj.conv.weight"], ["y"], name="proj")
    w = numpy_helper.from_array(rs.standard_normal((64, 64, 1, 1)).astype(np.float32), "proj.conv.weight")
    onnx.save(helper.make_model(helper.make_graph([node], "g", [x], [y], [w]),
                                opset_imports=[helper.make_opsetid("", 21)]), str(path))


def _digests(d):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def test_a_qdq_build_from_a_folder_holding_its_data_file_name_writes_the_same_bytes(tmp_path, monkeypatch):
    src = tmp_path / "src" / "m.onnx"
    src.parent.mkdir()
    _conv_model(src)
    rs = np.random.RandomState(1)
    feeds = [{"x": rs.standard_normal((1, 64, 1, 4)).astype(np.float32)} for _ in range(8)]
    outs = {}
    for where in ("clean", "crowded"):
        cwd = tmp_path / f"cwd-{where}"
        cwd.mkdir()
        if where == "crowded":
            (cwd / "q.onnx.data").write_bytes(b"a user's own file")
        monkeypatch.chdir(cwd)
        out = tmp_path / f"out-{where}"
        out.mkdir()
        quantize_qdq(src, out / "q.onnx", iter(feeds), get_scheme("w8a16"), ranges_cache=out / "ranges.json")
        outs[where] = out
    assert (tmp_path / "cwd-crowded" / "q.onnx.data").read_bytes() == b"a user's own file"
    assert (outs["clean"] / "q.onnx.data").is_file()
    assert _digests(outs["clean"]) == _digests(outs["crowded"])
    assert onnx.convert_model_to_external_data is external_data_helper.convert_model_to_external_data
    assert external_data_helper.convert_model_to_external_data.__module__ == "onnx.external_data_helper"


def test_the_cwd_check_is_onnx_s_own_outside_the_block(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.onnx.data").write_bytes(b"x")
    _conv_model(tmp_path / "m.onnx")
    model = onnx.load(str(tmp_path / "m.onnx"))
    try:
        external_data_helper.convert_model_to_external_data(model, location="m.onnx.data")
        raise AssertionError("onnx's own check no longer raises: beside_the_model may be unnecessary")
    except FileExistsError:
        pass
    with beside_the_model():
        external_data_helper.convert_model_to_external_data(model, location="m.onnx.data")
    assert all(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer)
