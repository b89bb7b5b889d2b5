"""Calibration sets: content-hashed, streamed, NaN refused, disjoint from the parity prompts."""
import numpy as np
import pytest

from omni_export.calibration.dataset import POOL_DIR, CalibrationSet, select, validate, write_indexed_set, write_set
from omni_export.checkpoints.tokenizer import byte_tokenizer
from omni_export.families import load_prompt_set
from omni_export.components.base import Rows, TensorSpec
from omni_export.errors import BadInput, CalibrationError


def _feeds(n, bad_at=None):
    for i in range(n):
        x = np.full((1, 4), float(i), np.float32)
        if i == bad_at:
            x[0, 2] = np.nan
        yield {"x": x}


def test_hash_is_content_addressed_and_stable(tmp_path):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir(), (tmp_path / "c").mkdir()
    a = write_set(tmp_path / "a", _feeds(10), 10, 4, "p", "h")
    b = write_set(tmp_path / "b", _feeds(10), 10, 4, "p", "h")
    c = write_set(tmp_path / "c", _feeds(10), 10, 5, "p", "h")
    assert a.hash == b.hash != c.hash
    assert a.samples == 4 and [float(f["x"][0, 0]) for f in a] == [0.0, 3.0, 6.0, 9.0]
    assert CalibrationSet.open(tmp_path / "a") == a


def test_nan_is_refused_naming_the_sample(tmp_path):
    with pytest.raises(CalibrationError, match=r"sample 3 input 'x' contains NaN"):
        write_set(tmp_path, _feeds(5, bad_at=3), 5, 5, "p", "h")


def test_validate_checks_shapes(tmp_path):
    cs = write_set(tmp_path, _feeds(3), 3, 3, "p", "h")
    validate(cs, [TensorSpec("x", (1, 4))])
    with pytest.raises(CalibrationError, match="expected"):
        validate(cs, [TensorSpec("x", (1, 5))])
    with pytest.raises(CalibrationError, match="lacks input"):
        validate(cs, [TensorSpec("y", (1, 4))])


def test_validate_checks_rows_inputs_without_assembling_them(tmp_path):
    """A ``Rows`` input (a decode step's KV cache) is checked as stored: its pool's shape and values and its indices
    (each a pool row or -1); what it assembles to is the same array stored whole."""
    pool = np.arange(2 * 3 * 4, dtype=np.float32).reshape(1, 2, 3, 4)  # 3 rows on axis 2
    feeds = [(0, {"x": np.zeros((1, 4), np.float32), "k": Rows("p0", np.array([0, 2, -1]), 2)}),
             (1, {"x": np.ones((1, 4), np.float32), "k": Rows("p0", np.array([1, -1, -1]), 2)})]
    cs = write_indexed_set(tmp_path, feeds, {0, 1}, "p", "h", {"p0": pool})
    specs = [TensorSpec("x", (1, 4)), TensorSpec("k", (1, 2, 3, 4))]
    validate(cs, specs)
    first = next(iter(cs))["k"]
    assert np.array_equal(first[:, :, :2], pool[:, :, [0, 2]]) and not first[:, :, 2].any()
    with pytest.raises(CalibrationError, match="has shape"):
        validate(cs, [TensorSpec("x", (1, 4)), TensorSpec("k", (1, 2, 4, 4))])
    bad = pool.copy()
    bad[0, 1, 1, 3] = np.inf
    np.save(cs.dir / POOL_DIR / "p0.npy", bad)  # a pool corrupted after writing
    with pytest.raises(CalibrationError, match="row pool 'p0' contains NaN"):
        validate(cs, specs)
    np.save(cs.dir / POOL_DIR / "p0.npy", pool[:, :, :2])  # a pool that lost a row index 2 refers to
    with pytest.raises(CalibrationError, match="indexes rows its pool 'p0' does not have"):
        validate(cs, specs)


def test_select_spreads_over_the_run():
    assert select(5, 10) == set(range(5))
    assert select(100, 3) == {0, 50, 99}


def test_shipped_prompt_sets_are_disjoint():
    cal, par = load_prompt_set("spark_calibration"), load_prompt_set("spark_parity")
    assert len(cal.prompts) >= 4 and len(par.prompts) >= 4
    assert not set(cal.prompts) & set(par.prompts)
    with pytest.raises(BadInput):
        load_prompt_set("nope")


def test_byte_tokenizer():
    t = byte_tokenizer(4096)
    assert t.encode("A") == [1, 65 + 3]
    assert t.encode("héllo", 3) == [1, 104 + 3, 0xC3 + 3]


def test_a_sample_reads_back_as_np_load_reads_it(tmp_path):
    """``read_sample`` (each distinct .npy header parsed once) gives exactly the arrays ``np.load`` gives: names,
    dtypes, shapes, memory order, values, and writable; a member it does not read plainly goes through ``np.load``."""
    from omni_export.calibration.dataset import read_sample

    rng = np.random.default_rng(0)
    arrays = {"x": rng.standard_normal((1, 3, 5)).astype(np.float32), "k_cache_0.rows": np.arange(7, dtype=np.int64),
              "k_cache_0.pool": np.array("k_0"), "k_cache_0.axis": np.array(2, np.int64),
              "f": np.asfortranarray(rng.standard_normal((4, 6))), "empty": np.zeros((0, 3), np.float16)}
    for i in range(2):  # the second file reuses the parsed headers
        np.savez(tmp_path / f"s{i}.npz", **arrays)
        got = read_sample(tmp_path / f"s{i}.npz")
        with np.load(tmp_path / f"s{i}.npz") as z:
            want = {k: z[k] for k in z.files}
        assert list(got) == list(want)
        for k in want:
            assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
            assert got[k].flags.f_contiguous == want[k].flags.f_contiguous and got[k].flags.writeable, k
            assert np.array_equal(got[k], want[k]), k
    np.savez_compressed(tmp_path / "c.npz", **arrays)  # compressed members: np.load's path
    assert all(np.array_equal(read_sample(tmp_path / "c.npz")[k], v) for k, v in arrays.items())
