"""The decoder LMs' w8a16 policy in the QDQ build: int16 weights by pattern, one encoding per part boundary and per
layer's cache row, fp16 islands and sink-carrying down_proj in the prefill, all recorded in the manifest."""
import dataclasses
import json

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from omni_export.artifacts.store import Store
from omni_export.quantize.policy import outlier_convs, shared_encodings, shared_groups
from omni_export.pipeline import Pipeline
from omni_export.recipes import Build, load_recipe
from omni_export.schemes import FloatOutliers


def encodings(path, tensor):
    """(scale bytes, zero point bytes) of every Q/DQ pair quantizing ``tensor`` in a QDQ graph."""
    g = onnx.load(str(path), load_external_data=False).graph
    inits = {t.name: t for t in g.initializer}
    found = set()
    for n in g.node:
        if (n.op_type == "QuantizeLinear" and n.input[0] == tensor) or (
                n.op_type == "DequantizeLinear" and n.output[0] == tensor):
            found.add((numpy_helper.to_array(inits[n.input[1]]).tobytes(),
                       numpy_helper.to_array(inits[n.input[2]]).tobytes()))
    return found


def test_shared_encoding_is_the_union_range_computed_once():
    groups = shared_groups({"part0": (["x", "k_cache_0"], ["h", "k_new_0"]), "part1": (["h"], ["y"])}, True)
    assert groups == [["h"], ["k_cache_0", "k_new_0"]]
    ovr, rec = shared_encodings([{"h": (-1.0, 3.0), "k_cache_0": (-2.0, 2.0), "k_new_0": (-1.0, 4.0)},
                                 {"h": (-2.0, 2.5)}], groups, "uint16")
    assert rec["h"]["range"] == [-2.0, 3.0] and rec["k_cache_0,k_new_0"]["range"] == [-2.0, 4.0]
    assert ovr["h"][0]["scale"].dtype == np.float32 and ovr["h"][0]["zero_point"].dtype == np.uint16
    assert ovr["h"][0]["scale"] == np.float32(5.0 / 65535) and int(ovr["h"][0]["zero_point"]) == round(2 / (5 / 65535))
    assert ovr["k_cache_0"][0]["scale"].tobytes() == ovr["k_new_0"][0]["scale"].tobytes()


def test_sink_layers_are_chosen_from_the_ranges(tmp_path):
    from onnx import TensorProto, helper
    nodes, inits = [], []
    for i in range(4):
        w = f"layers.{i}.mlp.down_proj.conv.weight"
        inits.append(numpy_helper.from_array(np.ones((2, 2, 1, 1), np.float32), w))
        nodes.append(helper.make_node("Conv", [f"in{i}", w], [f"out{i}"], name=f"down{i}"))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(f"in{i}", TensorProto.FLOAT, [1, 2, 1, 1])
                                       for i in range(4)],
                          [helper.make_tensor_value_info(f"out{i}", TensorProto.FLOAT, [1, 2, 1, 1]) for i in range(4)],
                          inits)
    onnx.save(helper.make_model(g), str(tmp_path / "m.onnx"))
    ranges = {"in0": (-3.0, 2.0), "in1": (-900.0, 25800.0), "in2": (-2.0, 4.0), "in3": (-1.0, 35.0)}
    chosen, rec = outlier_convs(tmp_path / "m.onnx", ranges, FloatOutliers(r"down_proj\.conv\.weight$", 10))
    assert chosen == ["down1"]  # median absmax 19.5: only layer 1 is above 195
    assert rec["median_absmax"] == 19.5 and rec["input_absmax"]["layers.3.mlp.down_proj.conv.weight"] == 35.0



def test_a_sink_layers_input_product_stays_float_with_it_when_asked(tmp_path):
    """``with_input``: the op computing a chosen conv's input and the moves laying its input and output out are float
    too, so the sink row's product and output never get a quantized range; other layers' stay quantized."""
    from onnx import TensorProto, helper
    nodes, inits, ins = [], [], []
    for i in range(3):
        w = f"layers.{i}.mlp.down_proj.conv.weight"
        inits.append(numpy_helper.from_array(np.ones((2, 2, 1, 1), np.float32), w))
        inits.append(numpy_helper.from_array(np.array([1, 2, 1, 1], np.int64), f"shape{i}"))
        ins += [helper.make_tensor_value_info(f"{ab}{i}", TensorProto.FLOAT, [1, 2]) for ab in "ab"]
        nodes += [helper.make_node("Mul", [f"a{i}", f"b{i}"], [f"prod{i}"], name=f"mul{i}"),
                  helper.make_node("Reshape", [f"prod{i}", f"shape{i}"], [f"in{i}"], name=f"reshape{i}"),
                  helper.make_node("Conv", [f"in{i}", w], [f"conv{i}"], name=f"down{i}"),
                  helper.make_node("Reshape", [f"conv{i}", f"shape{i}"], [f"out{i}"], name=f"back{i}")]
    g = helper.make_graph(nodes, "g", ins, [helper.make_tensor_value_info(f"out{i}", TensorProto.FLOAT, [1, 2, 1, 1])
                                            for i in range(3)], inits)
    onnx.save(helper.make_model(g), str(tmp_path / "m.onnx"))
    ranges = {"in0": (-3.0, 2.0), "in1": (-900.0, 3100.0), "in2": (-2.0, 4.0)}
    rule = FloatOutliers(r"down_proj\.conv\.weight$", 10)
    assert outlier_convs(tmp_path / "m.onnx", ranges, rule)[0] == ["down1"]
    chosen, rec = outlier_convs(tmp_path / "m.onnx", ranges, dataclasses.replace(rule, with_input=True))
    assert chosen == ["down1", "reshape1", "mul1", "back1"]
    assert rec["float_layout"] == {"layers.1.mlp.down_proj.conv.weight": ["reshape1", "mul1", "back1"]}


@pytest.mark.slow
def test_two_part_decode_step_shares_boundary_and_cache_encodings(tmp_path):
    r = load_recipe("spark_w8a16").with_overrides(parts=2)
    r = dataclasses.replace(r, builds=(Build("onnx", "fp32"), Build("qdq_onnx", "w8a16")), components=("decode_step",),
                            options={"decode_step": {"parts": 2}}, presets={})
    res = Pipeline(r, Store(tmp_path)).run()
    assert res.exit_code == 0
    _, qdq = res.artifacts
    d = qdq.shelf_dir
    info = json.loads((d / "manifest.json").read_text())["artifact"]
    a, b = encodings(d / "part0.onnx", "hidden_2"), encodings(d / "part1.onnx", "hidden_2")
    assert len(a) == 1 and a == b  # byte-identical scale and zero point on both sides of the boundary
    assert len(encodings(d / "part0.onnx", "k_cache_0") | encodings(d / "part0.onnx", "k_new_0")) == 1
    print(json.dumps({k: v for k, v in qdq.parity["outputs"].items()}, default=str)[:2000])
    assert qdq.parity["outputs"]["logits"]["snr_db"] >= 25 and qdq.status == "pass"
    # the manifest records the encoding both parts got for the boundary, and it is the one in the files
    boundary = next(v for k, v in info["export"]["shared_encodings"]["tensors"].items() if "hidden_2" in k.split(","))
    ((scale, _),) = a
    assert np.frombuffer(scale, np.float32)[0] == np.float32(boundary["scale"])
    assert set(info["export"]["component_policy"]) == {"part0", "part1"}
