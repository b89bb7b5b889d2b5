"""``read_sample`` reads a sample file in one call and slices each member from it: a damaged member fails as
``np.load`` fails on it, and a file ``np.savez`` did not write plainly goes through ``np.load``."""
import zipfile

import numpy as np
import pytest

from omni_export.calibration.dataset import read_sample


def _sample(path):
    arrays = {"x": np.arange(12, dtype=np.float32).reshape(1, 3, 4), "k_cache_0.rows": np.arange(5, dtype=np.int64)}
    np.savez(path, **arrays)
    return arrays


def test_a_damaged_member_fails_its_crc_check_as_np_load_does(tmp_path):
    p = tmp_path / "s.npz"
    _sample(p)
    raw = bytearray(p.read_bytes())
    at = raw.index(np.float32(7).tobytes())  # a value of x, inside its member's data
    raw[at] ^= 0xFF
    p.write_bytes(bytes(raw))
    with pytest.raises(zipfile.BadZipFile, match="CRC"):
        with np.load(p) as z:
            z["x"]
    with pytest.raises(zipfile.BadZipFile, match="CRC"):
        read_sample(p)


def test_members_read_back_as_their_own_aligned_writable_arrays(tmp_path):
    p = tmp_path / "s.npz"
    arrays = _sample(p)
    got = read_sample(p)
    assert list(got) == list(arrays)
    for k, v in arrays.items():
        assert got[k].dtype == v.dtype and np.array_equal(got[k], v), k
        assert got[k].flags.writeable and got[k].flags.aligned and got[k].flags.owndata is False, k
    got["x"][0, 0, 0] = -1.0  # each member has a buffer of its own: writing one leaves the others as read
    assert np.array_equal(got["k_cache_0.rows"], arrays["k_cache_0.rows"])


def test_a_file_with_a_member_zipfile_wrote_compressed_goes_through_np_load(tmp_path):
    p = tmp_path / "mixed.npz"
    arrays = _sample(p)
    with zipfile.ZipFile(p, "a", compression=zipfile.ZIP_DEFLATED) as z:  # a member appended compressed
        with z.open("y.npy", "w") as f:
            np.lib.format.write_array(f, np.ones(3, np.float16))
    got = read_sample(p)
    assert list(got) == [*arrays, "y"] and np.array_equal(got["y"], np.ones(3, np.float16))
