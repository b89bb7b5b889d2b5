"""A component's activation range margin (``qdq_quantize.widen_ranges``): calibrated ranges grow away from zero,
except where the op fixes the range itself (Clip bounds, Sigmoid, Softmax, Tanh)."""
import numpy as np
import onnx
from onnx import TensorProto, helper

from omni_export.quantize.qdq import BOUNDED_OPS, clip_bounds, widen_ranges


def _graph(path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4]) for n in ("sig", "soft", "th", "clip", "lin")]
    lo = helper.make_tensor("lo", TensorProto.FLOAT, [], [-0.5])
    hi = helper.make_tensor("hi", TensorProto.FLOAT, [], [6.0])
    nodes = [helper.make_node("Sigmoid", ["x"], ["sig"]), helper.make_node("Softmax", ["x"], ["soft"], axis=-1),
             helper.make_node("Tanh", ["x"], ["th"]), helper.make_node("Clip", ["x", "lo", "hi"], ["clip"]),
             helper.make_node("Neg", ["x"], ["lin"])]
    g = helper.make_graph(nodes, "g", [x], outs, initializer=[lo, hi])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]), str(path))


def test_bounded_ops_keep_their_natural_range_when_the_rest_is_widened(tmp_path):
    from onnxruntime.quantization.calibrate import (CalibrationMethod, TensorData, TensorsData, load_tensors_data,
                                                    save_tensors_data)
    _graph(tmp_path / "g.onnx")
    bounds = clip_bounds(tmp_path / "g.onnx")
    assert bounds == {"sig": BOUNDED_OPS["Sigmoid"], "soft": (0.0, 1.0), "th": (-1.0, 1.0), "clip": (-0.5, 6.0)}
    calibrated = {"sig": (0.1, 0.9), "soft": (0.0, 0.7), "th": (-0.8, 0.95), "clip": (-0.4, 5.0), "lin": (-3.0, 2.0)}
    cache = tmp_path / "ranges.json"
    save_tensors_data(TensorsData(CalibrationMethod.MinMax, {
        k: TensorData(lowest=np.float32(a), highest=np.float32(b)) for k, (a, b) in calibrated.items()}), cache)
    widen_ranges(cache, 2.0, bounds)
    got = {k: (float(t.range_value[0]), float(t.range_value[1])) for k, t in load_tensors_data(cache).items()}
    assert got["lin"] == (-6.0, 4.0)                      # widened 2x away from zero
    assert got["sig"] == (np.float32(0.1), 1.0) and got["soft"] == (0.0, 1.0)  # a positive floor stays, the top stops at 1
    assert got["th"] == (-1.0, 1.0) and got["clip"] == (-0.5, 6.0)
