"""The HTP's rule for a MatMul of two activations (``quantize.policy.matmul_rhs_groups``): its second input (attention's
K^T and V) is quantized int16 symmetric, with the Concat inputs that make it (a cache and its new row) on one
encoding. The QNN EP converts an asymmetric uint16 second input to uint8: on the HTP simulator the attention-score
MatMul of an asymmetric uint16 build lands at uint8 accuracy, the int16 symmetric build at CPU-QDQ's."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from omni_export.devices import get_device
from omni_export.quantize.policy import matmul_rhs_groups, merge_groups, rhs_overrides
from omni_export.quantize.qdq import quantize_qdq
from omni_export.runtimes import RuntimeUnavailable
from omni_export.runtimes.ort import cpu_session, htp_session
from omni_export.schemes import get_scheme


def _attention(path):
    """scores = q @ Transpose(Concat(k_cache, k_new)); and a weight MatMul, which the rule leaves alone."""
    f = TensorProto.FLOAT
    ins = [helper.make_tensor_value_info("q", f, [3, 3, 64]), helper.make_tensor_value_info("k_cache", f, [3, 128, 64]),
           helper.make_tensor_value_info("k_new", f, [3, 1, 64])]
    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((64, 8)).astype(np.float32), "w")
    nodes = [helper.make_node("Concat", ["k_cache", "k_new"], ["cat"], axis=1),
             helper.make_node("Transpose", ["cat"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["scores"]),
             helper.make_node("MatMul", ["q", "w"], ["proj"])]
    outs = [helper.make_tensor_value_info("scores", f, [3, 3, 129]), helper.make_tensor_value_info("proj", f, [3, 3, 8])]
    m = helper.make_model(helper.make_graph(nodes, "attn", ins, outs, [w]), opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    onnx.save(m, str(path))


def _feeds(n, seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        k = rng.standard_normal((3, 129, 64)).astype(np.float32) * 1.5
        k[:, :, 7] *= 5  # one large channel, as RoPE'd keys of trained models have
        out.append({"q": rng.standard_normal((3, 3, 64)).astype(np.float32) * 2, "k_cache": k[:, :128].copy(),
                    "k_new": k[:, 128:].copy()})
    return out


def _rhs_encoding(path):
    g = onnx.load(str(path)).graph
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    mm = next(n for n in g.node if n.op_type == "MatMul" and producer[n.input[1]].op_type == "DequantizeLinear"
              and "kt" in n.input[1])
    dq = producer[mm.input[1]]
    return inits[dq.input[1]], inits[dq.input[2]]


def test_the_second_input_of_an_activation_matmul_is_found_through_moves_and_its_concat():
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as d:
        _attention(Path(d) / "a.onnx")
        assert matmul_rhs_groups(onnx.load(str(Path(d) / "a.onnx")).graph) == [["cat", "k_cache", "k_new"]]
    assert merge_groups([["a", "b"], ["c"], ["b", "d"]]) == [["a", "b", "d"], ["c"]]


def test_int16_symmetric_second_input_keeps_the_htp_at_cpu_qdq_accuracy(tmp_path):
    src = tmp_path / "a.onnx"
    _attention(src)
    groups = matmul_rhs_groups(onnx.load(str(src)).graph)
    scheme = get_scheme("w8a16")
    asym, sym = tmp_path / "asym.onnx", tmp_path / "sym.onnx"
    quantize_qdq(src, asym, iter(_feeds(4, 0)), scheme)
    quantize_qdq(src, sym, iter(_feeds(4, 0)), scheme, fixed=rhs_overrides(groups, {}, None, "uint16"))
    scale, zp = _rhs_encoding(sym)
    assert zp.dtype == np.int16 and int(zp) == 0  # reaches the MatMul int16 symmetric, no conversion back to uint16
    assert _rhs_encoding(asym)[1].dtype == np.uint16
    feed = _feeds(4, 0)[0]  # a calibration feed: nothing clips, the CPU-QDQ error is rounding only
    exact = feed["q"] @ np.concatenate([feed["k_cache"], feed["k_new"]], 1).transpose(0, 2, 1)

    def snr(a, b):
        return 10 * np.log10((a.astype(np.float64) ** 2).sum() / ((a.astype(np.float64) - b) ** 2).sum())

    try:
        got = {p.stem: (cpu_session(p).run(["scores"], feed)[0],
                        htp_session(p, get_device("galaxy_s25")).run(["scores"], feed)[0]) for p in (asym, sym)}
    except RuntimeUnavailable as e:
        pytest.skip(f"no QNN HTP simulator: {e}")
    for name, (cpu, htp) in got.items():
        assert snr(exact, cpu) > 60, (name, snr(exact, cpu))  # CPU-QDQ is faithful either way
    assert snr(got["asym"][0], got["asym"][1]) < 40  # the QNN EP's uint8 conversion of input 1
    assert snr(got["sym"][0], got["sym"][1]) > 55


def _v_attention(path):
    """out = probs @ Concat(v_cache, v_new), where v_new (a graph output, as a decode step's new row) is a Reshape of
    a projection: onnxruntime's quantizer gives a Reshape output its input's encoding."""
    f = TensorProto.FLOAT
    ins = [helper.make_tensor_value_info("x", f, [1, 64]), helper.make_tensor_value_info("probs", f, [3, 1, 129]),
           helper.make_tensor_value_info("v_cache", f, [3, 128, 64])]
    w = numpy_helper.from_array(np.random.default_rng(2).standard_normal((64, 192)).astype(np.float32) / 8, "w")
    shape = numpy_helper.from_array(np.array([3, 1, 64], np.int64), "shape")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["proj"]), helper.make_node("Reshape", ["proj", "shape"], ["v_new"]),
             helper.make_node("Concat", ["v_cache", "v_new"], ["cat"], axis=1),
             helper.make_node("MatMul", ["probs", "cat"], ["out"])]
    outs = [helper.make_tensor_value_info("out", f, [3, 1, 64]), helper.make_tensor_value_info("v_new", f, [3, 1, 64])]
    m = helper.make_model(helper.make_graph(nodes, "v", ins, outs, [w, shape]), opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    onnx.save(m, str(path))


def test_a_new_row_moved_from_a_projection_is_converted_to_the_group_encoding_and_the_file_holds_it(tmp_path):
    """V's new row is a Reshape of a projection, and onnxruntime's quantizer gives a Reshape output its input's
    encoding. The projection's output is converted to the group's encoding for the Reshape alone
    (``moved_new_rows``), so the written graph holds the Concat's inputs on one int16 symmetric encoding (read back
    by ``off_plan_int16``) and the projection keeps its uint16 one; the HTP runs the V MatMul at CPU-QDQ's accuracy.
    Without the conversion the read-back names the new row: it keeps the projection's uint16 encoding."""
    from omni_export.quantize.policy import moved_new_rows
    from omni_export.quantize.readback import off_plan_int16, written_encodings

    src = tmp_path / "v.onnx"
    _v_attention(src)
    graph = onnx.load(str(src)).graph
    groups = matmul_rhs_groups(graph)
    assert groups == [["cat", "v_cache", "v_new"]]
    converted = moved_new_rows(graph, groups)
    assert converted == {"proj": (next(n.name for n in graph.node if n.op_type == "Reshape"), "v_new")}
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal((1, 64)).astype(np.float32), "probs": rng.random((3, 1, 129)).astype(np.float32),
              "v_cache": rng.standard_normal((3, 128, 64)).astype(np.float32)} for _ in range(4)]
    built = {}
    for name, conv in (("plan", converted), ("unconverted", None)):
        built[name] = tmp_path / f"{name}.onnx"
        quantize_qdq(src, built[name], iter(feeds), get_scheme("w8a16"),
                     fixed=rhs_overrides(groups, {}, None, "uint16", conv))
    enc = written_encodings(built["plan"], ["cat", "v_cache", "v_new", "proj"])
    assert enc["proj"]["type"] == "uint16"  # the projection's own output encoding stays
    assert all(enc[t]["type"] == "int16" and enc[t]["zero_point"] == 0 for t in ("cat", "v_cache", "v_new")), enc
    assert off_plan_int16(built["plan"], groups) == {}
    off = off_plan_int16(built["unconverted"], groups)
    assert set(off) == {"v_new"} and off["v_new"].startswith("uint16 scale"), off
    k_src, k_dst = tmp_path / "a.onnx", tmp_path / "a_qdq.onnx"
    _attention(k_src)
    k_graph = onnx.load(str(k_src)).graph
    k_groups = matmul_rhs_groups(k_graph)
    assert moved_new_rows(k_graph, k_groups) == {}  # K's new row is a graph input here: nothing to convert
    quantize_qdq(k_src, k_dst, iter(_feeds(4, 0)), get_scheme("w8a16"),
                 fixed=rhs_overrides(k_groups, {}, None, "uint16"))
    assert off_plan_int16(k_dst, k_groups) == {}
    try:
        got = {k: (cpu_session(p).run(["out"], feeds[0])[0],
                   htp_session(p, get_device("galaxy_s25")).run(["out"], feeds[0])[0]) for k, p in built.items()}
    except RuntimeUnavailable as e:
        pytest.skip(f"no QNN HTP simulator: {e}")
    cpu, htp = got["plan"]
    assert 10 * np.log10((cpu.astype(np.float64) ** 2).sum() / ((cpu.astype(np.float64) - htp) ** 2).sum()) > 55
