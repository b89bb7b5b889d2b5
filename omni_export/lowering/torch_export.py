"""What the targets that lower through ``torch.export`` share (the ExecuTorch targets, ``executorch_llm``, ``coreml``):
the lowering passes silenced, torch.fx provenance records kept by reference while exporting, the tanh GELU written
as its own ops for XNNPACK, and an error's first line for a one-line message."""
from __future__ import annotations

import contextlib
import io
import logging
import math
import warnings


@contextlib.contextmanager
def quiet_lowering():
    """Silence Python-level warnings, logging and progress bars of the lowering passes."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        level = logging.root.level
        logging.root.setLevel(logging.ERROR)
        try:
            yield
        finally:
            logging.root.setLevel(level)


@contextlib.contextmanager
def provenance_by_reference():
    """torch.fx records where every node came from (``node.meta["from_node"]``, a chain of ``NodeSource``) and each
    new record deep-copies its source's whole chain, which grows by one link per pass: copying it was an eighth of
    lowering the SmolLM2 decode step to XNNPACK. The records are never changed once made, so while exporting here a
    new record refers to its source's links instead of copying them (its own list, the same links); the ``.pte``
    is byte-identical (``tests/exporters/test_executorch.py``)."""
    from torch.fx import traceback as fx_traceback

    cls = fx_traceback.NodeSource
    original = cls.__init__

    def init(self, node, pass_name="", action=None):
        original(self, None, pass_name, action)
        if node:
            self.node_info = cls.NodeInfo(name=node.name, target=str(node.target), graph_id=id(node.graph))
            self.from_node = list(node.meta.get("from_node", ()))

    cls.__init__ = init
    try:
        yield
    finally:
        cls.__init__ = original


def first_line(e: Exception) -> str:
    """An exception's first line, at most 300 characters: what a one-line error quotes of it."""
    return (str(e).splitlines() or [type(e).__name__])[0][:300]


def _is_gelu_tanh(node) -> bool:
    import torch
    return (node.op == "call_function" and node.target == torch.ops.aten.gelu.default
            and (node.kwargs.get("approximate") == "tanh" or node.args[1:2] == ("tanh",)))


def gelu_tanh_as_ops(program):
    """``program`` with every ``aten.gelu(approximate="tanh")`` written as the formula's own ops (mul, add, tanh);
    unchanged (the same object) where it has none. XNNPACK in executorch 1.5.1 lowers that GELU as the erf GELU,
    another function: 74.1 dB from eager on unit-scale inputs, and Gemma 3's fp32 decode step at 72.8 dB
    (``tests/lowering/test_torch_export.py``); its tanh and mul are exact (144 dB). An XNNPACK gelu that honours
    ``approximate`` would remove this."""
    import torch

    if not any(_is_gelu_tanh(n) for n in program.graph_module.graph.nodes):
        return program
    k = math.sqrt(2.0 / math.pi)

    def gelu(x, approximate="none"):
        if approximate != "tanh":
            return NotImplemented  # the erf GELU stays one op: XNNPACK computes it (142.7 dB)
        return 0.5 * x * (1.0 + torch.tanh(k * (x + 0.044715 * x * x * x)))
    return program.run_decompositions({torch.ops.aten.gelu.default: gelu})
