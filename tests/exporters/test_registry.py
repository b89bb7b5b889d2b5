"""The target registry lists exactly the exporter modules, and every rewrite preserves the fp32 function."""
import importlib
import pkgutil

import numpy as np
import torch

import omni_export.exporters as ex
from omni_export.blocks.graph_forms import LinearAsConv, linear_to_conv
from omni_export.schemes import SCHEMES

def test_registry_matches_target_modules():
    """Every module of ``exporters`` but ``base`` (the types the targets share) is a target module: it defines a
    ``Target`` subclass and its ``TARGET``, named as the module. Every such module is in the registry, and every
    registered target comes from one. Quantization machinery (``quantize``) and export steps (``lowering``) live
    elsewhere."""
    modules, helpers = set(), set()
    for m in pkgutil.iter_modules(ex.__path__):
        mod = importlib.import_module(f"{ex.__name__}.{m.name}")
        defines = [v for v in vars(mod).values() if isinstance(v, type) and issubclass(v, ex.Target)
                   and v is not ex.Target and v.__module__ == mod.__name__]
        if defines:
            assert isinstance(getattr(mod, "TARGET", None), ex.Target), f"{m.name} defines a target but no TARGET"
            modules.add(m.name)
        elif m.name != "base":
            helpers.add(m.name)
    assert helpers == set(), f"not target modules: {sorted(helpers)}"
    reg = ex.registry()
    assert {t.__class__.__module__.rsplit(".", 1)[1] for t in reg.values()} == modules
    named = {n: t.__class__.__module__.rsplit(".", 1)[1] for n, t in reg.items()}
    assert named == {n: n for n in reg}  # each target's module is named as the target
    for t in reg.values():
        assert t.schemes and set(t.schemes) <= set(SCHEMES), t.name
        for s in t.schemes:
            for dep_t, dep_s in t.dependencies(s):
                assert dep_s in reg[dep_t].schemes


def test_linear_to_conv_preserves_the_decode_step(tiny_spark):
    from omni_export.components.decoder_lm import DecodeStepComponent
    comp = DecodeStepComponent(tiny_spark, 64)
    conv = linear_to_conv(comp.module)
    assert any(isinstance(m, LinearAsConv) for m in conv.modules())
    assert not any(isinstance(m, LinearAsConv) for m in comp.module.modules())  # the input is not mutated
    prompt = [1, 40, 41, 42, 43]
    a, _ = comp.run_tokens(comp.eager_runner(), prompt, n_new=20)
    b, _ = comp.run_tokens(comp.eager_runner(conv), prompt, n_new=20)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-4, atol=1e-5)


def test_linear_as_conv_puts_rows_on_the_width_and_computes_the_same(tiny_spark, tmp_path):
    """Many rows go in as the conv's width ([1, in, 1, rows]), never its batch (the HTP compiles a batch of rows
    very slowly), and any leading shape gives the linear's result."""
    import onnx

    from omni_export.components.decoder_prefill import PrefillComponent
    from omni_export.lowering.onnx_export import export_onnx

    lin = torch.nn.Linear(12, 7)
    conv = LinearAsConv(lin)
    for shape in ((1, 1, 12), (1, 5, 12), (2, 3, 12), (12,)):
        x = torch.randn(shape)
        torch.testing.assert_close(conv(x), lin(x), rtol=1e-5, atol=1e-6)

    pre = PrefillComponent(tiny_spark, 64, rows=8)
    g = pre.graphs()[0]
    path = export_onnx(linear_to_conv(g.module), g, tmp_path / "prefill.onnx")
    m = onnx.shape_inference.infer_shapes(onnx.load(str(path), load_external_data=False))
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in m.graph.value_info}
    conv_inputs = [shapes[n.input[0]] for n in m.graph.node if n.op_type == "Conv"]
    assert conv_inputs and all(s[0] == 1 and s[2] == 1 and s[3] == 8 for s in conv_inputs), conv_inputs
