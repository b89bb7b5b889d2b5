"""The QDQ source graph: the fp32 ONNX export with its projections rewritten as 1x1 convs in the ONNX graph
(``onnx_rewrites.matmul_as_conv``) computes the same function, in the conv-form export's layout and names; and the
per-channel weight scales computed here (``qdq_quantize.weight_overrides``) give onnxruntime's own QDQ graph."""
import numpy as np
import onnx
import pytest
import torch

from omni_export.components.decoder_lm import DecodeStepComponent
from omni_export.components.decoder_prefill import PrefillComponent
from omni_export.quantize import qdq as qdq_quantize
from omni_export.lowering.onnx_export import export_onnx
from omni_export.lowering.onnx_rewrites import matmul_as_conv
from omni_export.blocks.graph_forms import linear_to_conv
from omni_export.runtimes.ort import cpu_session
from omni_export.schemes import get_scheme


def _shapes(path):
    m = onnx.shape_inference.infer_shapes(onnx.load(str(path), load_external_data=False))
    vals = list(m.graph.value_info) + list(m.graph.input) + list(m.graph.output)
    return m, {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in vals}


def _feeds(path, seed=0):
    rs = np.random.RandomState(seed)
    return {i.name: rs.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in onnx.load(str(path), load_external_data=False).graph.input}


def _graph(shape, outputs):
    """The graph interface ``export_onnx`` reads, for a module of one float input ``x`` of ``shape``."""
    class G:
        name = "g"
        inputs = (type("S", (), {"name": "x", "shape": shape})(),)

        @staticmethod
        def example_inputs():
            return (torch.randn(*shape),)

    G.outputs = tuple(type("S", (), {"name": n})() for n in outputs)
    return G


@pytest.mark.parametrize("rows", [1, 8])
def test_matmul_as_conv_is_the_conv_form_of_the_fp32_graph(tiny_spark, tmp_path, rows):
    comp = DecodeStepComponent(tiny_spark, 64) if rows == 1 else PrefillComponent(tiny_spark, 64, rows=rows)
    g = comp.graphs()[0]
    fp32 = export_onnx(g.module, g, tmp_path / "fp32.onnx")
    n = matmul_as_conv(fp32, tmp_path / "conv.onnx")
    torch_conv = export_onnx(linear_to_conv(g.module), g, tmp_path / "torch_conv.onnx")  # the torch-side rewrite
    m, shapes = _shapes(tmp_path / "conv.onnx")
    t, _ = _shapes(torch_conv)
    inits = {i.name for i in m.graph.initializer}
    convs = [x for x in m.graph.node if x.op_type == "Conv"]
    # every projection became a conv, named as the torch conv-form export names its weights, none left as MatMul
    assert n == len(convs) == sum(1 for x in t.graph.node if x.op_type == "Conv") > 0
    assert {c.input[1] for c in convs} == {x.input[1] for x in t.graph.node if x.op_type == "Conv"}
    assert not any(x.op_type == "MatMul" and x.input[1] in inits for x in m.graph.node)
    # rows on the width ([1, in, 1, rows]), never the batch: the layout the HTP compiles fast
    assert all(shapes[c.input[0]][0] == 1 and shapes[c.input[0]][2] == 1 and shapes[c.input[0]][3] == rows
               for c in convs)
    # the same function as the fp32 graph, output by output
    feed = _feeds(fp32)
    a, b = cpu_session(fp32), cpu_session(tmp_path / "conv.onnx")
    for name, x, y in zip([o.name for o in a.get_outputs()], a.run(None, feed), b.run(None, feed)):
        np.testing.assert_allclose(y, x, rtol=1e-4, atol=1e-5, err_msg=name)


def test_matmul_as_conv_folds_a_bias_and_keeps_shared_inputs_laid_out_once(tmp_path):
    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(6, 5), torch.nn.Linear(6, 3, bias=False)

        def forward(self, x):
            return self.a(x), self.b(x)

    torch.manual_seed(0)
    fp32 = export_onnx(Two(), _graph((2, 3, 6), ("ya", "yb")), tmp_path / "fp32.onnx")
    assert matmul_as_conv(fp32, tmp_path / "conv.onnx") == 2
    m = onnx.load(str(tmp_path / "conv.onnx"))
    ops = [x.op_type for x in m.graph.node]
    assert "Add" not in ops and "MatMul" not in ops  # the bias went into the conv
    assert sum(1 for x in m.graph.node if x.op_type == "Conv" and len(x.input) == 3) == 1
    assert ops.count("Transpose") == 1 + 2  # the shared input laid out once, each output once
    feed = _feeds(fp32)
    for x, y in zip(cpu_session(fp32).run(None, feed), cpu_session(tmp_path / "conv.onnx").run(None, feed)):
        np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-6)


def test_matmul_as_conv_lays_out_a_weight_an_unrolled_loop_reads_once(tmp_path):
    """A Linear called 15 times (Qwen3-TTS's frame predictor unrolls its passes so): one conv weight that the 15 convs
    share, each conv and its output named once, the same function."""
    class Loop(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 4, bias=False)

        def forward(self, x):
            for _ in range(15):
                x = torch.tanh(self.proj(x))
            return x

    torch.manual_seed(0)
    fp32 = export_onnx(Loop(), _graph((1, 1, 4), ("y",)), tmp_path / "fp32.onnx")
    assert matmul_as_conv(fp32, tmp_path / "conv.onnx") == 15
    m = onnx.load(str(tmp_path / "conv.onnx"))
    convs = [x for x in m.graph.node if x.op_type == "Conv"]
    assert len(convs) == 15 and len({c.input[1] for c in convs}) == 1
    assert len({c.name for c in convs}) == len({c.output[0] for c in convs}) == 15
    assert [i.name for i in m.graph.initializer].count(convs[0].input[1]) == 1
    feed = _feeds(fp32)
    np.testing.assert_allclose(cpu_session(tmp_path / "conv.onnx").run(None, feed)[0],
                               cpu_session(fp32).run(None, feed)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scheme,wide", [("w8a16", False), ("w4a16", False), ("w8a16", True)])
def test_vectorized_weight_scales_give_onnxruntime_own_graph(tmp_path, monkeypatch, scheme, wide):
    """Channels at the edges of onnxruntime's rules: all zero, below its minimum real range, one-signed, huge.
    ``wide``: the weight kept at int16 by a component policy (``int16_weights``), its scales computed here too."""
    from onnx import TensorProto, helper, numpy_helper
    rs = np.random.RandomState(0)
    w = rs.standard_normal((8, 4, 1, 1)).astype(np.float32)
    w[0] = 0
    w[1] *= 1e-7
    w[2] = -np.abs(w[2])
    w[3] = np.abs(w[3])
    w[4] *= 1e4
    w[5] = 1e-42  # subnormal
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[1, 1])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 1, 3])],
                              [numpy_helper.from_array(w, "w")])
    src = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), str(src))
    feeds = [{"x": rs.standard_normal((1, 4, 1, 3)).astype(np.float32)} for _ in range(3)]
    assert qdq_quantize.weight_overrides(src, get_scheme(scheme), 1e-4)["w"][0]["axis"] == 0
    ovr = qdq_quantize.int16_weights(["w"]) if wide else None
    if wide:
        assert len(qdq_quantize._int16_scales(src, get_scheme(scheme), ovr, None)["w"]) == 8
    import onnxruntime.quantization.qdq_quantizer as ort_qdq

    def computed(*a, **k):
        raise AssertionError("onnxruntime computed a weight's scales that were given")
    with monkeypatch.context() as m:
        m.setattr(ort_qdq, "compute_data_quant_params", computed)
        qdq_quantize.quantize_qdq(src, tmp_path / "ours.onnx", iter(feeds), get_scheme(scheme), ovr)
    monkeypatch.setattr(qdq_quantize, "weight_overrides", lambda *a, **k: {})  # onnxruntime computes them itself
    qdq_quantize.quantize_qdq(src, tmp_path / "ort.onnx", iter(feeds), get_scheme(scheme), ovr)
    a, b = (onnx.load(str(tmp_path / f)) for f in ("ours.onnx", "ort.onnx"))
    ia, ib = ({i.name: numpy_helper.to_array(i) for i in x.graph.initializer} for x in (a, b))
    assert set(ia) == set(ib)
    for k in ia:
        assert ia[k].dtype == ib[k].dtype and np.array_equal(ia[k], ib[k]), k
    assert ia["w_quantized"].dtype == (np.int16 if wide else ia["w_quantized"].dtype)
    assert [n.SerializeToString() for n in a.graph.node] == [n.SerializeToString() for n in b.graph.node]


@pytest.mark.parametrize("qtype", ["INT8", "INT16", "UINT8", "UINT16"])
@pytest.mark.parametrize("shape", [(8, 4, 1, 1), (130, 7)])
def test_per_channel_weights_quantized_at_once_are_onnxruntime_own(qtype, shape):
    """All channels at once in two threads (``qdq_quantize._per_channel_initializer``) against onnxruntime's
    channel-by-channel ``quantize_onnx_initializer``: the same initializer, byte for byte, with values on rounding
    ties, beyond the grid (clipped) and of both signs."""
    from onnx import TensorProto, numpy_helper
    from onnxruntime.quantization.quant_utils import quantize_onnx_initializer

    rs = np.random.RandomState(1)
    t = getattr(TensorProto, qtype)
    dt = onnx.helper.tensor_dtype_to_np_dtype(t)
    w = (rs.standard_normal(shape) * 3).astype(np.float32)
    w.reshape(shape[0], -1)[:, 0] = 2.5  # a tie: round half to even
    w.reshape(shape[0], -1)[0, :] = 1e9  # clipped
    scale = (np.abs(rs.standard_normal(shape[0])) / 50 + 1e-3).astype(np.float32)
    zp = np.full(shape[0], 0 if dt in (np.int8, np.int16) else np.iinfo(dt).max // 2 + 1, dt)
    init = numpy_helper.from_array(w, "w")
    ours = qdq_quantize._per_channel_initializer(quantize_onnx_initializer)(init, t, zp, scale, 0)
    theirs = quantize_onnx_initializer(init, t, zp, scale, 0)
    assert ours.SerializeToString() == theirs.SerializeToString()
    assert numpy_helper.to_array(ours).dtype == dt
