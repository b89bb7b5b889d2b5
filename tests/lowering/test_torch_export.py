"""``lowering.torch_export.gelu_tanh_as_ops``: XNNPACK (executorch 1.5.1) computes ``gelu(approximate="tanh")`` as
the erf GELU; written as the formula's own ops, the lowered program computes the tanh GELU."""
import numpy as np
import pytest
import torch

from omni_export.lowering.torch_export import gelu_tanh_as_ops

pytest.importorskip("executorch")


class Gelu(torch.nn.Module):
    def __init__(self, approximate: str):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return torch.nn.functional.gelu(x, approximate=self.approximate) * 2


def lowered(program, x) -> torch.Tensor:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    et = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch()
    return Runtime.get().load_program(et.buffer).load_method("forward").execute([x])[0]


def snr_db(ref, test) -> float:
    ref, test = ref.double().numpy(), test.double().numpy()
    return float(10 * np.log10((ref ** 2).sum() / ((ref - test) ** 2).sum()))


def test_the_tanh_gelu_lowers_to_the_tanh_gelu_and_the_erf_gelu_stays_one_op():
    x = torch.randn(4, 2048, generator=torch.Generator().manual_seed(0))
    tanh = torch.export.export(Gelu("tanh"), (x,))
    with torch.no_grad():
        want = Gelu("tanh")(x)
    assert snr_db(want, lowered(tanh, x)) < 90  # as exported: XNNPACK computes another function (74 dB)
    rewritten = gelu_tanh_as_ops(torch.export.export(Gelu("tanh"), (x,)))
    assert not any(n.target == torch.ops.aten.gelu.default for n in rewritten.graph.nodes)
    assert snr_db(want, lowered(rewritten, x)) > 130
    erf = torch.export.export(Gelu("none"), (x,))
    assert gelu_tanh_as_ops(erf) is erf  # unchanged: XNNPACK's GELU is the erf GELU
