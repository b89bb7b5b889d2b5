"""torch -> ONNX (opset 21, dynamo exporter, weights as external data). Shared by the ONNX-based targets."""
from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path

import torch

from ..errors import StoreIOError, UnsupportedError, is_disk_full, write_failure
from .onnx_rewrites import fuse_rmsnorm

OPSET = 21  # from opset 18 the ORT quantizer deep-copies the model to upgrade it (2x memory); 21 avoids that


def export_onnx(module: torch.nn.Module, graph, path: Path, fuse_norms: bool = True) -> Path:
    """Export ``module`` (a component graph's module or a rewritten copy) with the graph's IO names. Every RMSNorm
    the exporter decomposes is fused back into one op (``onnx_rewrites.fuse_rmsnorm``) unless ``fuse_norms`` is
    off (the naive build a gate must block keeps the decomposed form)."""
    try:
        write_program(module, graph.example_inputs(), path, [s.name for s in graph.inputs],
                      [s.name for s in graph.outputs])
        if fuse_norms:
            fuse_rmsnorm(path, path)
    except Exception as e:
        if is_disk_full(e):
            raise StoreIOError(f"disk full while writing the ONNX export of graph {graph.name} ({path.name})") from None
        if (refused := write_failure(e, path)) is not None:  # a short write, EIO: the filesystem, not the graph
            raise StoreIOError(f"ONNX export of graph {graph.name}: {refused}") from None
        raise UnsupportedError(f"ONNX export of graph {graph.name} failed: {str(e).splitlines()[0][:300]}") from None
    return path


def write_program(module: torch.nn.Module, example: tuple, path: Path, input_names: list[str],
                  output_names: list[str], dynamic_shapes=None) -> None:
    """The dynamo export of ``module`` on ``example`` written to ``path`` (weights as external data): the
    optimizer's multi-output patterns fail fast (``_multi_output_fast_fail``), the machine's stack traces and paths
    are stripped (``strip_local_metadata``) and folded transposes are written contiguous (``_contiguous_on_write``).
    Every ONNX-based target exports through here."""
    module = module.eval()
    for p in module.parameters():
        p.requires_grad_(False)
    with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            _multi_output_fast_fail():
        warnings.simplefilter("ignore")
        logging.getLogger("torch.onnx").setLevel(logging.ERROR)
        prog = torch.onnx.export(module, example, None, input_names=input_names, output_names=output_names,
                                 opset_version=OPSET, dynamo=True, dynamic_shapes=dynamic_shapes, verbose=False,
                                 optimize=True)
        strip_local_metadata(prog.model)
        with _contiguous_on_write(prog.model):
            prog.save(str(path), include_initializers=True, keep_initializers_as_inputs=False, external_data=True)


@contextlib.contextmanager
def _multi_output_fast_fail():
    """The exporter's optimizer (onnxscript's rewrite rules) matches a pattern with several output nodes by first
    listing every node of the graph by op type, for every node it tries, before it checks that the node it tries
    has the op of the pattern's first output node at all: quadratic in the graph's size, 62 % of exporting the
    unrolled Qwen3-TTS frame predictor. While exporting, a node whose op type or domain that first pattern node does
    not match fails at once, as every combination would have failed on it (the first output node is always that
    node); everything else runs as before, and the exported graph is byte-identical
    (``tests/lowering/test_onnx_export.py``)."""
    try:
        from onnxscript.rewriter import _basics
        from onnxscript.rewriter._matcher import SimplePatternMatcher
    except ImportError:  # another onnxscript layout: nothing to speed up
        yield
        return
    saved = SimplePatternMatcher.match

    def match(self, model, graph_or_function, node, **kw):
        first = self.pattern.output_nodes[0] if not self.pattern.has_single_output_node else None
        if first is not None and not (first.op.matches(node.op_type) and first.domain.matches(node.domain)):
            return _basics.MatchResult().fail("No match found.")
        return saved(self, model, graph_or_function, node, **kw)

    SimplePatternMatcher.match = match
    try:
        yield
    finally:
        SimplePatternMatcher.match = saved


KEPT_NODE_METADATA = ("pkg.torch.onnx.name_scopes", "pkg.torch.onnx.class_hierarchy", "namespace")
# module names and classes: the graph rewrites and the sensitivity pass find layers by them; no file paths in them


def strip_local_metadata(model) -> None:
    """Drop what describes the machine the graph was exported on rather than the graph: the exporter's stack traces
    (``pkg.torch.onnx.stack_trace``: absolute paths of the checkout), FX node dumps, torch.export signatures, and
    every doc string. The same component exported from two checkouts in different directories is then the same
    bytes."""
    model.doc_string = None
    model.metadata_props.clear()
    graphs = [model.graph, *model.functions.values()]
    for g in graphs:
        g.doc_string = None
        if hasattr(g, "metadata_props"):
            g.metadata_props.clear()
        values = list(g.inputs) + list(g.outputs) + list(getattr(g, "initializers", {}).values())
        for node in (g.all_nodes() if hasattr(g, "all_nodes") else g):
            node.doc_string = None
            for k in [k for k in node.metadata_props if k not in KEPT_NODE_METADATA]:
                del node.metadata_props[k]
            values += list(node.outputs)
        for v in values:
            if v is not None:
                v.metadata_props.clear()
                v.doc_string = None


PREFETCH_MAX = 256 << 20  # a folded transpose up to this size is made contiguous ahead, while the one before is written


@contextlib.contextmanager
def _contiguous_on_write(model):
    """The exporter's constant folding leaves each folded weight transpose (MatMul's [in, out] weight) as a strided
    numpy view, and numpy writes a strided array element by element: at full size that walk was most of a part's
    save. While the block runs, each such tensor is made contiguous (torch's blocked transpose) when it is written,
    and the next one (up to ``PREFETCH_MAX``) in a second thread while this one is written, so at most one tensor
    beyond the one being written is held. Same bytes in the file."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    import onnx_ir as ir

    def dense(a):
        try:
            return torch.from_numpy(a).contiguous().numpy()
        except (TypeError, ValueError):  # a dtype torch has no type for
            return np.ascontiguousarray(a)

    strided = []  # (value, raw array) in the order the writer meets them
    for v in model.graph.initializers.values():
        t = v.const_value
        raw = getattr(t, "raw", None)
        if type(t) is ir.Tensor and isinstance(raw, np.ndarray) and not raw.flags["C_CONTIGUOUS"]:
            strided.append((v, raw))
    ahead: dict[int, object] = {}  # index -> future of its contiguous copy (at most one)
    with ThreadPoolExecutor(1) as ex:
        def get(i: int):
            fut = ahead.pop(i, None)
            out = fut.result() if fut is not None else dense(strided[i][1])
            if not ahead and i + 1 < len(strided) and strided[i + 1][1].nbytes <= PREFETCH_MAX:
                ahead[i + 1] = ex.submit(dense, strided[i + 1][1])
            return ir.Tensor(out, name=strided[i][0].const_value.name)

        for i, (v, _) in enumerate(strided):
            t = v.const_value
            v.const_value = ir.LazyTensor(lambda i=i: get(i), dtype=t.dtype, shape=t.shape, name=t.name, cache=False)
        yield
        ahead.clear()


def onnx_files(path: Path, graph_name: str = "model") -> dict[str, str]:
    """Logical names of one graph's files: ``<graph>`` for the model, ``<graph>.weights`` for its external data."""
    files = {graph_name: path.name}
    data = path.with_name(path.name + ".data")
    if data.exists():
        files[f"{graph_name}.weights"] = data.name
    return files
