"""Per-layer sensitivity of a QDQ graph against its fp32 source, measured by executing both on ORT CPU.

For every weight-bearing node (a Conv: the projections are written as 1x1 Convs) two figures, over the same inputs:

- ``weight_snr_db``: that layer alone - its input as the quantized graph computes it, multiplied by the fp32 weight
  and by the dequantized weight the artifact ships. The weight quantization error of this layer, isolated.
- ``cumulative_snr_db``: the layer's output in the quantized graph against the fp32 graph's - everything lost up to
  and including this layer (weights and 16-bit activations alike).

The intermediate tensors are read by adding them as graph outputs to private copies of the two graphs; nothing is
simulated. The mixed-precision search ranks layers by ``weight_snr_db`` (lowest first).
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np

from ..artifacts.onnx_external import beside_the_model
from ..parity.metrics import snr_db
from ..runtimes.ort import cpu_session


def _load(path: Path, tmp: Path):
    """Load a graph with its weights from a private copy (shelved files are hard links, which onnx refuses)."""
    import onnx
    d = tmp / f"src-{len(list(tmp.iterdir()))}"
    d.mkdir()
    for f in Path(path).parent.glob(Path(path).name + "*"):
        shutil.copyfile(f, d / f.name)
    return onnx.load(str(d / Path(path).name), load_external_data=True)


def weight_layers(model) -> list[dict]:
    """Conv nodes whose weight is an initializer, in graph order: ``{"layer", "node", "weight", "input", "output",
    "conv"}`` (``conv``: the node's stride, padding, dilation and group, for ``_conv``)."""
    from onnx import helper

    inits = {i.name for i in model.graph.initializer}
    out = []
    for n in model.graph.node:
        if n.op_type == "Conv" and len(n.input) > 1 and n.input[1] in inits:
            attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
            if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
                raise ValueError(f"Conv {n.name}: auto_pad {attrs['auto_pad']!r} is not measured here")
            conv = {k: attrs[k] for k in ("strides", "pads", "dilations", "group") if k in attrs}
            layer = n.input[1].removesuffix(".weight").removesuffix(".conv")
            out.append({"layer": layer, "node": n.name, "weight": n.input[1], "input": n.input[0], "output": n.output[0],
                        "conv": conv})
    return out


def _run_with(model, extra: list[str], feeds: list[dict], tmp: Path, tag: str) -> list[dict[str, np.ndarray]]:
    """Run ``model`` with ``extra`` intermediate tensors exposed as outputs; one dict per feed."""
    import onnx
    have = {o.name for o in model.graph.output}
    for name in extra:
        if name not in have:
            model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
            have.add(name)
    path = tmp / f"{tag}.onnx"
    with beside_the_model():
        onnx.save_model(model, str(path), save_as_external_data=True, location=f"{tag}.onnx.data")
    sess = cpu_session(path)
    names = [o.name for o in sess.get_outputs()]
    inputs = {i.name for i in sess.get_inputs()}
    rows = []
    for f in feeds:
        vals = sess.run(names, {k: np.ascontiguousarray(v, np.float32) for k, v in f.items() if k in inputs})
        rows.append(dict(zip(names, vals)))
    return rows


def _conv(x: np.ndarray, w: np.ndarray, conv: dict) -> np.ndarray:
    """The Conv node without its bias, in float64: x [N, Cin, *spatial], w [Cout, Cin / group, *kernel]. A 1x1
    projection is one matrix product; any other kernel runs through torch's conv of its rank."""
    nd = w.ndim - 2
    one = (all(k == 1 for k in w.shape[2:]) and conv.get("group", 1) == 1 and not any(conv.get("pads", ()))
           and all(s == 1 for s in conv.get("strides", ())) and x.shape[2:] == (1,) * nd)
    if one:
        return x.reshape(x.shape[0], -1).astype(np.float64) @ w.reshape(w.shape[0], -1).T.astype(np.float64)
    import torch
    import torch.nn.functional as F

    pads = list(conv.get("pads", [0] * 2 * nd))
    begin, end = pads[:nd], pads[nd:]
    xt = torch.from_numpy(np.ascontiguousarray(x, np.float64))
    if begin != end:  # asymmetric: pad explicitly (F.pad takes the last axis first)
        xt = F.pad(xt, [p for b, e in zip(reversed(begin), reversed(end)) for p in (b, e)])
        begin = [0] * nd
    fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
    y = fn(xt, torch.from_numpy(np.ascontiguousarray(w, np.float64)), stride=list(conv.get("strides", [1] * nd)),
           padding=begin, dilation=list(conv.get("dilations", [1] * nd)), groups=conv.get("group", 1))
    return y.numpy()


def analyze(fp32_path: Path, qdq_path: Path, feeds: list[dict], inputs_label: str) -> dict:
    """Sensitivity of the QDQ graph at ``qdq_path`` against ``fp32_path`` over ``feeds`` (graph inputs)."""
    import onnx
    from onnx import numpy_helper

    with tempfile.TemporaryDirectory(prefix="omni-sens-") as td:
        fp32, qdq = _load(fp32_path, Path(td)), _load(qdq_path, Path(td))
    layers = weight_layers(fp32)
    weights = {i.name: numpy_helper.to_array(i) for i in fp32.graph.initializer}
    by_node = {n.name: n for n in qdq.graph.node}
    for lay in layers:
        n = by_node.get(lay["node"])
        if n is None:
            raise ValueError(f"node {lay['node']} of the fp32 graph is missing from the quantized graph")
        lay["q_input"], lay["q_weight"] = n.input[0], n.input[1]
    graph_outputs = [o.name for o in fp32.graph.output]
    with tempfile.TemporaryDirectory(prefix="omni-sens-") as td:
        ref = _run_with(fp32, [lay["output"] for lay in layers], feeds, Path(td), "fp32")
        # the dequantized weights once (one call), the activations per feed: a trained 30-layer model's weights
        # exposed on every one of its 333 parity calls would be ~180 GB
        deq = onnx.ModelProto()
        deq.CopyFrom(qdq)
        wq_of = _run_with(deq, [lay["q_weight"] for lay in layers if lay["q_weight"] != lay["weight"]], feeds[:1],
                          Path(td), "qdq-weights")[0]
        del deq
        got = _run_with(qdq, [x for lay in layers for x in (lay["q_input"], lay["output"])], feeds, Path(td), "qdq")
    rows = []
    for lay in layers:
        w = weights[lay["weight"]]
        quantized = lay["q_weight"] != lay["weight"]
        wq = wq_of[lay["q_weight"]] if quantized else w
        x = np.concatenate([g[lay["q_input"]] for g in got])
        rows.append({"layer": lay["layer"], "node": lay["node"], "weight": lay["weight"], "quantized": quantized,
                     "weight_snr_db": round(snr_db(_conv(x, w, lay["conv"]), _conv(x, wq, lay["conv"])), 3),
                     "cumulative_snr_db": round(snr_db(np.concatenate([r[lay["output"]] for r in ref]),
                                                       np.concatenate([g[lay["output"]] for g in got])), 3)})
    outputs = {n: round(snr_db(np.concatenate([r[n] for r in ref]), np.concatenate([g[n] for g in got])), 3)
               for n in graph_outputs}
    return {"inputs": inputs_label, "samples": len(feeds), "layers": rows, "outputs_snr_db": outputs}


def _scope(node) -> str:
    """The module path the torch exporter recorded for ``node`` (innermost), or ''."""
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            scopes = [x.strip(" '\"") for x in prop.value.strip("[]").split(",")]
            return next((x for x in reversed(scopes) if "." in x), "")
    return ""


def stage_tensors(model, stages: list[tuple[str, str]], last: str) -> list[tuple[str, str]]:
    """``stages``: (label, module-path prefix) in execution order -> (label, tensor each stage hands on): the first
    activation the next stage reads from outside itself (through a concatenation with a carried state input, the
    computed part); the last stage hands on ``last``."""
    inits = {i.name for i in model.graph.initializer}
    inputs = {i.name for i in model.graph.input}
    producer = {o: n for n in model.graph.node for o in n.output}
    out = []
    for (label, _), (_, nxt) in zip(stages, stages[1:]):
        inside = {o for n in model.graph.node if (_scope(n) + ".").startswith(nxt) for o in n.output}
        found = None
        for n in model.graph.node:
            if found is None and (_scope(n) + ".").startswith(nxt):
                found = next((x for x in n.input if x and x not in inits and x not in inputs and x not in inside), None)
        p = producer.get(found)
        while p is not None and p.op_type == "Concat" and any(x in inputs for x in p.input):
            found = next(x for x in p.input if x not in inputs)
            p = producer.get(found)
        if found is None:
            raise ValueError(f"no tensor enters stage {nxt!r} from outside it")
        out.append((label, found))
    return out + [(stages[-1][0], last)]


def stage_snr(fp32_path: Path, qdq_path: Path, feeds: list[dict], stages: list[tuple[str, str]], last: str) -> list[dict]:
    """Per-stage fidelity of the QDQ graph: SNR of each stage's output against the fp32 graph's over the same
    ``feeds`` (graph inputs), both graphs executed on ORT CPU with the stage outputs exposed."""
    with tempfile.TemporaryDirectory(prefix="omni-sens-") as td:
        fp32, qdq = _load(fp32_path, Path(td)), _load(qdq_path, Path(td))
        named = stage_tensors(fp32, stages, last)
        ref = _run_with(fp32, [t for _, t in named], feeds, Path(td), "fp32")
        got = _run_with(qdq, [t for _, t in named], feeds, Path(td), "qdq")
    return [{"stage": label, "tensor": t,
             "snr_db": round(snr_db(np.concatenate([r[t].ravel() for r in ref]),
                                    np.concatenate([g[t].ravel() for g in got])), 2)} for label, t in named]


def ranking(result: dict) -> list[str]:
    """Quantized layers' weights, the most sensitive (lowest isolated weight SNR) first."""
    rows = [r for r in result["layers"] if r["quantized"]]
    return [r["weight"] for r in sorted(rows, key=lambda r: r["weight_snr_db"])]


def plot(result: dict, path: Path, title: str) -> Path:
    """A PNG: isolated weight SNR (bars) and cumulative SNR (line) per layer, in graph order."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["layers"]
    xs = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * len(rows) + 2), 4.2))
    ax.bar(xs, [r["weight_snr_db"] for r in rows], color="#8fb3d9", label="this layer's weights alone")
    ax.plot(xs, [r["cumulative_snr_db"] for r in rows], "o-", color="#c0392b", label="cumulative (layer output)")
    ax.set_xticks(xs, [r["layer"] for r in rows], rotation=75, fontsize=7)
    ax.set_ylabel("SNR vs fp32 (dB)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="lower left")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
