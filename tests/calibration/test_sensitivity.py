"""Per-layer sensitivity, measured by executing the fp32 and QDQ graphs with intermediate outputs exposed."""
import json

import pytest

from omni_export.calibration import sensitivity
from omni_export.quantize.qdq import quantize_qdq
from omni_export.schemes import get_scheme


@pytest.fixture(scope="module")
def w8a16(small):
    dst = small.dir / "sens" / "model.onnx"
    dst.parent.mkdir()
    quantize_qdq(small.src, dst, iter(small.calibration), get_scheme("w8a16"))
    return dst


def test_every_projection_gets_an_isolated_and_a_cumulative_figure(small, w8a16, tmp_path):
    feeds = list(small.calibration)
    res = sensitivity.analyze(small.src, w8a16, feeds, "calibration")
    layers = [r["layer"] for r in res["layers"]]
    # 2 layers x (q_k_v, g, out, gate, up, down) + lm_head, in graph order
    assert len(layers) == 13 and layers[0] == "layers.0.self_attn.q_k_v_proj" and layers[-1] == "lm_head"
    assert all(r["quantized"] for r in res["layers"])
    for r in res["layers"]:
        # int8 per-channel symmetric weights: ~6 dB per bit minus the Gaussian crest -> 35-50 dB on one projection;
        # far below fp32 agreement (>100 dB), far above a broken scale (< 10 dB)
        assert 35 < r["weight_snr_db"] < 50, r
        assert r["cumulative_snr_db"] < 60
    # error accumulates along the graph: the last projection is worse than the first
    assert res["layers"][-1]["cumulative_snr_db"] < res["layers"][0]["cumulative_snr_db"]
    assert res["samples"] == len(feeds) and "logits" in res["outputs_snr_db"]
    order = sensitivity.ranking(res)
    worst = min(res["layers"], key=lambda r: r["weight_snr_db"])
    assert order[0] == worst["weight"] and len(order) == 13
    png = sensitivity.plot(res, tmp_path / "s.png", "small w8a16")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    json.dumps(res)  # saved as JSON by the sweep


def test_a_layer_left_in_float_reports_no_weight_error(small, tmp_path):
    import onnx
    from onnxruntime.quantization import QuantType, quantize_static
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    from omni_export.quantize.qdq import _Reader

    nodes = [n.name for n in onnx.load(str(small.src), load_external_data=False).graph.node if n.op_type == "Conv"]
    dst = tmp_path / "model.onnx"
    # the last projection (lm_head) excluded from quantization: its weight stays fp32 in the QDQ graph
    qc = get_qnn_qdq_config(str(small.src), _Reader(iter(small.calibration)), activation_type=QuantType.QUInt16,
                            weight_type=QuantType.QInt8, per_channel=True, nodes_to_exclude=[nodes[-1]])
    quantize_static(str(small.src), str(dst), qc.calibration_data_reader, per_channel=True,
                    activation_type=qc.activation_type, weight_type=qc.weight_type,
                    nodes_to_exclude=qc.nodes_to_exclude, use_external_data_format=True, extra_options=qc.extra_options)
    res = sensitivity.analyze(small.src, dst, list(small.calibration)[:4], "calibration")
    last = res["layers"][-1]
    assert last["layer"] == "lm_head" and not last["quantized"] and last["weight_snr_db"] == 300.0
    assert "lm_head.conv.weight" not in sensitivity.ranking(res)


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [7], "dilations": [3], "pads": [9, 9]},                 # a residual unit's dilated conv
    {"kernel_shape": [7], "group": 4, "pads": [6, 0]},                      # depthwise-style, causal (left) padding
    {"kernel_shape": [4], "strides": [2], "pads": [1, 2]},
    {"kernel_shape": [1]},                                                  # a 1x1 over a length: per position
])
def test_a_conv_of_any_kernel_is_recomputed_as_onnxruntime_computes_it(attrs):
    """The weight figure recomputes the node itself (Code2Wav's k7 convs broke the 1x1-only product): checked
    against ORT CPU running the same Conv node."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    g = attrs.get("group", 1)
    x = rng.standard_normal((2, 8, 40)).astype(np.float32)
    w = rng.standard_normal((12, 8 // g, attrs["kernel_shape"][0])).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="c", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    (lay,) = sensitivity.weight_layers(model)
    got = sensitivity._conv(x, w, lay["conv"])
    assert got.shape == want.shape and np.abs(got - want).max() < 1e-4
