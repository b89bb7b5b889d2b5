"""The fp32 ONNX export fuses each decomposed RMSNorm into one SimplifiedLayerNormalization: same function."""
from collections import Counter

import numpy as np
import onnx

from omni_export.components.decoder_lm import DecodeStepComponent
from omni_export.lowering.onnx_export import export_onnx
from omni_export.lowering.onnx_rewrites import fuse_rmsnorm
from omni_export.runtimes.ort import cpu_session


def test_fused_rmsnorm_computes_the_decomposed_graph(tiny_spark, tmp_path):
    comp = DecodeStepComponent(tiny_spark, 64)
    g = comp.graphs()[0]
    plain = export_onnx(g.module, g, tmp_path / "plain.onnx", fuse_norms=False)
    ops = Counter(n.op_type for n in onnx.load(str(plain), load_external_data=False).graph.node)
    norms = 2 * tiny_spark.config.num_hidden_layers + 1  # input + post-attention norm per layer, final norm
    assert ops["Pow"] == ops["Sqrt"] == ops["Reciprocal"] == norms and "SimplifiedLayerNormalization" not in ops
    assert fuse_rmsnorm(plain, tmp_path / "fused.onnx") == norms
    fused = onnx.load(str(tmp_path / "fused.onnx"), load_external_data=False).graph
    after = Counter(n.op_type for n in fused.node)
    assert after["SimplifiedLayerNormalization"] == norms
    assert after["Pow"] == after["Sqrt"] == after["Reciprocal"] == after["ReduceMean"] == 0
    assert sum(after.values()) == sum(ops.values()) - 6 * norms
    assert next(a.f for a in fused.node[0].attribute if a.name == "epsilon") == np.float32(tiny_spark.config.rms_norm_eps)
    rs = np.random.RandomState(0)
    feed = {s.name: rs.standard_normal(s.shape).astype(np.float32) for s in g.inputs}
    feed["embeds"] = feed["embeds"] * 30  # a wide-range residual stream, as trained weights have
    names = [s.name for s in g.outputs]
    a = cpu_session(plain).run(names, feed)
    b = cpu_session(tmp_path / "fused.onnx").run(names, feed)
    for x, y in zip(a, b):
        err = np.abs(x - y).max() / np.abs(x).max()
        assert err < 1e-5, err
    # the default export is the fused one, sharing the weight file it was written with
    default = export_onnx(g.module, g, tmp_path / "default.onnx")
    assert Counter(n.op_type for n in onnx.load(str(default), load_external_data=False).graph.node) == after
