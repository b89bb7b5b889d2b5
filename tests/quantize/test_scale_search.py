"""Per-channel weight scales searched on the calibration activations (``quantize.scale_search``): the Gram matrix
is the calibration inputs' X^T X, the search never loses to min-max on the output error it minimizes, it clips
channels whose few large weights waste the grid, and a QDQ build with it carries the searched scales."""
import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from omni_export.quantize.qdq import calibrate_part, quantize_part
from omni_export.quantize.scale_search import BATCH, GramAccumulator, Rows, eligible_convs, load_grams, search_scales
from omni_export.schemes import get_scheme


def _err(w, q, g):
    d = w - q
    return np.einsum("oi,oi->o", d @ g, d)


def _quantized(w, scale):
    return np.clip(np.round(w / scale[:, None]), -127, 127) * scale[:, None]


def test_the_search_never_loses_to_min_max_and_clips_an_outlier_channel():
    rs = np.random.RandomState(0)
    x = rs.standard_normal((512, 64)).astype(np.float32)
    w = rs.standard_normal((8, 64)).astype(np.float32)
    w[3, 5] = 40.0  # one large weight: min-max's step for channel 3 is 40/127 ...
    x[:, 5] *= 1e-3  # ... on an input the calibration text barely drives: its clipping costs little output error
    g = x.T.astype(np.float64) @ x
    absmax = np.abs(w).max(axis=1)
    scale, ratio = search_scales(w, g, -127, 127, absmax)
    minmax = (absmax * 2 / 254).astype(np.float32)
    assert np.all(_err(w, _quantized(w, scale), g) <= _err(w, _quantized(w, minmax), g) + 1e-9)
    assert ratio[3] < 1.0 and scale[3] < minmax[3]  # the outlier's channel is clipped
    assert _err(w, _quantized(w, scale), g)[3] < 0.9 * _err(w, _quantized(w, minmax), g)[3]


def test_gram_accumulator_is_x_transpose_x_over_every_row(tmp_path):
    rs = np.random.RandomState(1)
    xs = [rs.standard_normal((1, 6, 1, 3)).astype(np.float32) for _ in range(300)]  # [1, in, 1, rows]
    acc = GramAccumulator(["x"])
    for x in xs:
        acc.add({"x": x})
    acc.save(tmp_path / "g.npz")
    rows = np.concatenate([np.moveaxis(x, 1, -1).reshape(-1, 6) for x in xs]).astype(np.float64)
    np.testing.assert_allclose(load_grams(tmp_path / "g.npz")["x"], rows.T @ rows, rtol=1e-10)


def test_fewer_rows_than_channels_are_kept_as_rows_and_search_the_same_scales(tmp_path):
    """A full-size decode step calibrates 16 rows into 6,656-wide inputs: the rows are saved, not a 6,656^2 Gram
    matrix, and the search on them picks the same ratio for every channel as on their Gram matrix."""
    rs = np.random.RandomState(3)
    width, n = 300, 40
    acc = GramAccumulator(["few", "many"])
    drive = rs.gamma(0.5, size=(1, width, 1, 1)) * (np.arange(width) >= 4)[None, :, None, None] + 1e-3
    xs = [(rs.standard_normal((1, width, 1, 1)) * drive).astype(np.float32) for _ in range(n)]
    for x in xs:
        acc.add({"few": x, "many": x[:, :8]})  # 40 rows: fewer than 300 channels, more than 8
    acc.save(tmp_path / "g.npz")
    grams = load_grams(tmp_path / "g.npz")
    rows = np.concatenate([x.reshape(1, width) for x in xs])
    assert isinstance(grams["few"], Rows) and np.array_equal(grams["few"].x, rows)
    assert isinstance(grams["many"], np.ndarray) and grams["many"].shape == (8, 8)
    w = rs.standard_normal((64, width)).astype(np.float32)
    w[:, :4] *= 10  # outliers on inputs the rows barely drive: many channels clip
    absmax = np.abs(w).max(axis=1)
    s_rows, r_rows = search_scales(w, grams["few"], -127, 127, absmax)
    s_gram, r_gram = search_scales(w, grams["few"].gram, -127, 127, absmax)
    assert (r_rows < 1).sum() >= 8
    np.testing.assert_array_equal(r_rows, r_gram)
    np.testing.assert_array_equal(s_rows, s_gram)


def test_the_gram_matrix_is_folded_in_the_same_groups_as_rows_arrive(tmp_path):
    """Once a tensor has more rows than channels its Gram matrix is summed group by group (BATCH rows) in arrival
    order, bit for bit the sum a fold at every BATCH rows gives, whatever was held back before."""
    rs = np.random.RandomState(4)
    xs = [rs.standard_normal((1, 64, 1, 5)).astype(np.float32) for _ in range(200)]  # 1,000 rows, 64 channels
    acc = GramAccumulator(["x"])
    for x in xs:
        acc.add({"x": x})
    acc.save(tmp_path / "g.npz")
    expected, group, held = 0, [], 0
    for x in xs:
        group.append(np.moveaxis(x, 1, -1).reshape(-1, 64))
        held += 5
        if held >= BATCH:
            r = np.concatenate(group).astype(np.float64)
            expected, group, held = expected + r.T @ r, [], 0
    r = np.concatenate(group).astype(np.float64)
    expected = expected + r.T @ r
    assert np.array_equal(load_grams(tmp_path / "g.npz")["x"], expected)


def _conv_model(path, w):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, w.shape[1], 1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, w.shape[0], 1, 4])
    node = helper.make_node("Conv", ["x", "proj.conv.weight"], ["y"], name="proj")
    g = helper.make_graph([node], "g", [x], [y], [numpy_helper.from_array(w, "proj.conv.weight")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]), str(path))


def test_a_qdq_build_with_the_search_carries_the_searched_scales(tmp_path):
    rs = np.random.RandomState(2)
    w = rs.standard_normal((16, 32, 1, 1)).astype(np.float32)
    w[0, 7] = 25.0
    src = tmp_path / "part" / "m.onnx"
    src.parent.mkdir()
    _conv_model(src, w)
    assert eligible_convs(onnx.load(str(src))) == {"proj.conv.weight": "x"}
    feeds = [{"x": rs.standard_normal((1, 32, 1, 4)).astype(np.float32) * (np.arange(32) != 7).astype(np.float32)[None, :, None, None]}
             for _ in range(64)]  # input 7, the large weight's, is never driven
    scheme = get_scheme("w8a16")
    found = calibrate_part(src, iter(feeds), scheme, tmp_path / "part" / "ranges.json", search=True)
    rec = found["record"]["proj.conv.weight"]
    assert rec["channels"] == 16 and rec["clipped_channels"] >= 1
    scales = [c["scale"] for c in found["overrides"]["proj.conv.weight"]]
    dst = tmp_path / "q.onnx"
    quantize_part(src, dst, (), scheme, found["overrides"], 1.0, tmp_path / "part" / "ranges.json")
    m = onnx.load(str(dst))
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    dq = next(n for n in m.graph.node if n.op_type == "DequantizeLinear" and "weight" in n.input[0])
    np.testing.assert_array_equal(inits[dq.input[1]], np.asarray(scales, np.float32))
    json.dumps(found)  # recorded in the manifest as is



def test_a_large_weight_searched_in_two_row_halves_gives_the_one_pass_errors():
    """Weights of >= 1 M elements compute each candidate's residual in two threads over row halves: every channel's
    error, and so its scale, is the single pass's (the residual is elementwise)."""
    rs = np.random.RandomState(3)
    w = rs.standard_normal((1024, 1024)).astype(np.float32)
    x = rs.standard_normal((40, 1024)).astype(np.float32)
    absmax = np.abs(w).max(axis=1)
    scale, ratio = search_scales(w, Rows(x), -127, 127, absmax)
    best = _one_pass(w, x, absmax)  # the one-pass residual, as the search computed it before
    assert np.array_equal(ratio, best)
    assert np.array_equal(scale, (absmax.astype(np.float64) * 2 / 254.0 * best).astype(np.float32))


def _one_pass(w, x, absmax):
    """The exact search as it was first written: every candidate's error over every row, one channel at a time."""
    base = absmax.astype(np.float64) * 2 / 254.0
    f = np.ascontiguousarray(x.T / np.sqrt(np.square(x, dtype=np.float64).sum(axis=0).max()), np.float32)
    best, best_err = np.ones(len(w)), np.full(len(w), np.inf)
    for r in np.round(np.linspace(1.0, 0.5, 11), 3):
        s = (base * r).astype(np.float32)[:, None]
        d = w - np.clip(np.round(w / s), -127, 127) * s
        p = d @ f
        err = np.einsum("or,or->o", p, p, dtype=np.float64)
        best = np.where(err < best_err, r, best)
        best_err = np.minimum(err, best_err)
    return best


def test_many_rows_rule_out_candidates_on_bounds_and_give_the_exact_search_s_scales(monkeypatch):
    """Many calibration rows whose energy lies in a few directions (as real activations' does): most candidates are
    ruled out on the bounds of those directions, only the channels left with two or more are searched exactly,
    and every channel gets the ratio the exact search gives."""
    import omni_export.quantize.scale_search as ss

    rs = np.random.RandomState(5)
    rows, width, out = 512, 1024, 768
    spectrum = np.exp(-np.arange(96) / 12.0)[:, None]  # decaying energies, then a faint floor
    x = (rs.standard_normal((rows, 96)) @ (spectrum * rs.standard_normal((96, width)))
         + 1e-4 * rs.standard_normal((rows, width))).astype(np.float32)
    w = rs.standard_normal((out, width)).astype(np.float32)
    w[rs.randint(0, out, 40), rs.randint(0, width, 40)] = 30.0  # outlier weights: those channels clip
    absmax = np.abs(w).max(axis=1)
    exact_rows = []
    real_exact = ss._exact
    monkeypatch.setattr(ss, "_exact", lambda w_, *a: exact_rows.append(len(w_)) or real_exact(w_, *a))
    held = Rows(x)
    scale, ratio = search_scales(w, held, -127, 127, absmax)
    u, lam = held.basis()
    assert u.shape[1] <= rows // 2 and np.all(np.diff(lam) <= 0)
    np.testing.assert_allclose(u.T @ u, np.eye(u.shape[1]), atol=1e-5)  # orthonormal directions
    assert len(exact_rows) == 1 and 0 < exact_rows[0] < out // 4  # most channels decided on the bounds alone
    expected = _one_pass(w, x, absmax)
    assert (expected < 1).sum() >= 40
    np.testing.assert_array_equal(ratio, expected)
    np.testing.assert_array_equal(scale, (absmax.astype(np.float64) * 2 / 254.0 * expected).astype(np.float32))
    few = search_scales(w[:100], Rows(x), -127, 127, absmax[:100])[1]  # fewer channels than rows: exact, no bounds
    np.testing.assert_array_equal(few, expected[:100])
    assert exact_rows[1:] == [100]
