"""The target registry lists exactly the exporter modules, and every rewrite preserves the fp32 function."""
import pkgutil

import numpy as np
import torch

import omni_export.exporters as ex
from omni_export.exporters.rewrites import REWRITES, LinearAsConv
from omni_export.schemes import SCHEMES

HELPERS = {"rewrites", "onnx_export"}  # modules that are not targets


def test_registry_matches_target_modules():
    modules = {m.name for m in pkgutil.iter_modules(ex.__path__)} - HELPERS
    reg = ex.registry()
    assert {t.__class__.__module__.rsplit(".", 1)[1] for t in reg.values()} == modules
    for t in reg.values():
        assert t.schemes and set(t.schemes) <= set(SCHEMES), t.name
        for s in t.schemes:
            for dep_t, dep_s in t.dependencies(s):
                assert dep_s in reg[dep_t].schemes


def test_linear_to_conv_preserves_the_decode_step(tiny_spark):
    from omni_export.components.spark_decode import SparkDecodeComponent
    comp = SparkDecodeComponent(tiny_spark, 64)
    conv = REWRITES["linear_to_conv"](comp.module)
    assert any(isinstance(m, LinearAsConv) for m in conv.modules())
    assert not any(isinstance(m, LinearAsConv) for m in comp.module.modules())  # the input is not mutated
    prompt = [1, 40, 41, 42, 43]
    a, _ = comp.run_tokens(comp.eager_runner(), prompt, n_new=20)
    b, _ = comp.run_tokens(comp.eager_runner(conv), prompt, n_new=20)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-4, atol=1e-5)
