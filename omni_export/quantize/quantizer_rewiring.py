"""onnxruntime's QDQ quantizer with its consumer rewiring through an index (``indexed_rewiring``): the quantizer
``qdq`` runs, with the same quantized graph."""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def indexed_rewiring():
    """onnxruntime's quantizer rewires every consumer of a tensor it quantizes by visiting every node of the graph
    (``ONNXModel.replace_input_of_all_nodes``): quadratic in the graph's size (on the SmolLM2 decode step, 2,110
    rewirings of a graph that grows to 5,903 nodes). While it quantizes, that rewiring visits only the nodes an
    index of consumers lists. The index is built from the graph at the first rewiring and follows the quantizer's
    own ways of changing which node reads what (``add_node``, which ``add_nodes`` calls; the rewiring itself;
    ``replace_input_of_nodes``); it is rebuilt from the graph when another graph is rewired, when the node count is
    not the one it followed (a node removed, or added another way), and after a lone ``replace_node_input`` (whose
    graph it cannot tell). A listed node is rewired only where it still reads the tensor, as before, so the
    quantized graph is byte-identical (``tests/quantize/test_qdq_calibration.py``). Outputs are rewired as before,
    node by node, asking each node's output list for the name first (a membership test in C): the quantizer does
    that for graph outputs only."""
    from onnxruntime.quantization.onnx_model import ONNXModel

    state: dict = {"model": None, "reads": {}, "nodes": -1}  # the graph indexed, tensor -> nodes reading it, count

    def reads(model) -> dict:
        if state["model"] is not model or state["nodes"] != len(model.graph.node):
            by_name: dict[str, list] = {}
            for node in model.graph.node:
                for name in node.input:
                    by_name.setdefault(name, []).append(node)
            state.update(model=model, reads=by_name, nodes=len(model.graph.node))
        return state["reads"]

    def inputs(self, old, new):
        by_name = reads(self.model)
        for node in list(by_name.get(old, ())):
            if old in node.input:
                replace(node, old, new)
                by_name.setdefault(new, []).append(node)

    def of_nodes(self, old, new, node_names):
        for node in self.model.graph.node:
            if node.name in node_names:
                hit = old in node.input
                replace(node, old, new)
                if hit and state["model"] is self.model:
                    state["reads"].setdefault(new, []).append(node)

    def outputs(self, old, new):
        for node in self.model.graph.node:
            if old in node.output:
                ONNXModel.replace_node_output(node, old, new)

    def lone(node, old, new):
        replace(node, old, new)
        state["model"] = None  # whose node this is is not known here: the index is rebuilt at its next use

    def add_node(self, node):
        add(self, node)
        if state["model"] is self.model and state["nodes"] + 1 == len(self.model.graph.node):
            added = self.model.graph.node[-1]  # the graph's own copy of ``node`` (extend copies it)
            for name in added.input:
                state["reads"].setdefault(name, []).append(added)
            state["nodes"] += 1

    names = ("replace_input_of_all_nodes", "replace_input_of_nodes", "replace_output_of_all_nodes",
             "replace_node_input", "add_node")
    saved = {n: ONNXModel.__dict__[n] for n in names}
    replace, add = ONNXModel.replace_node_input, ONNXModel.add_node
    for n, f in zip(names, (inputs, of_nodes, outputs, staticmethod(lone), add_node)):
        setattr(ONNXModel, n, f)
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(ONNXModel, n, f)
