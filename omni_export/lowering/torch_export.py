"""What the targets that lower through ``torch.export`` share (the ExecuTorch targets, ``executorch_llm``, ``coreml``):
the lowering passes silenced, torch.fx provenance records kept by reference while exporting, and an error's first
line for a one-line message."""
from __future__ import annotations

import contextlib
import io
import logging
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
