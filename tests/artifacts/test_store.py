"""The store: atomic directories, resumable steps, shelves that never leave a stale publication, full disk."""
import errno
import json
import os

import pytest

from omni_export.artifacts import store as store_mod
from omni_export.artifacts.store import Store, atomic_dir
from omni_export.errors import StoreIOError


def test_atomic_dir_leaves_nothing_on_failure(tmp_path):
    final = tmp_path / "a" / "step"
    with pytest.raises(RuntimeError):
        with atomic_dir(final) as tmp:
            (tmp / "half.bin").write_bytes(b"x" * 10)
            raise RuntimeError("boom")
    assert not final.exists()
    assert list((tmp_path / "a").iterdir()) == []


def test_step_runs_once_then_resumes(tmp_path):
    s, calls = Store(tmp_path), []

    def build(d):
        calls.append(1)
        (d / "out.txt").write_text("done")

    d1, reused1 = s.run_step("k", {"a": 1}, build)
    d2, reused2 = s.run_step("k", {"a": 1}, build)
    assert (reused1, reused2, len(calls)) == (False, True, 1)
    assert d1 == d2 and (d2 / "out.txt").read_text() == "done"
    d3, reused3 = s.run_step("k", {"a": 2}, build)
    assert not reused3 and d3 != d1


def test_interrupted_step_is_rebuilt(tmp_path):
    s = Store(tmp_path)

    def crash(d):
        (d / "partial").write_text("x")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        s.run_step("k", {"a": 1}, crash)
    assert s.cached("k", {"a": 1}) is None
    d, reused = s.run_step("k", {"a": 1}, lambda d: (d / "ok").write_text("y"))
    assert not reused and (d / "ok").exists() and not (d / "partial").exists()


def test_place_moves_between_shelves(tmp_path):
    s = Store(tmp_path)
    f = tmp_path / "model.onnx"
    f.write_bytes(b"onnx")
    s.place("published", "r", "art", {"model.onnx": f}, {"verdict": {"status": "pass"}})
    assert (tmp_path / "published/r/art/model.onnx").read_bytes() == b"onnx"
    s.place("blocked", "r", "art", {"model.onnx": f}, {"verdict": {"status": "blocked"}})
    assert not (tmp_path / "published/r/art").exists()
    assert json.loads((tmp_path / "blocked/r/art/manifest.json").read_text())["verdict"]["status"] == "blocked"


def test_full_disk_is_a_clear_error_and_leaves_nothing(tmp_path, monkeypatch):
    s = Store(tmp_path)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store_mod, "_fsync_tree", full)
    with pytest.raises(StoreIOError, match="disk full while writing"):
        s.run_step("k", {"a": 1}, lambda d: (d / "big").write_bytes(b"0" * 100))
    assert not any(p.name != "k" for p in (tmp_path / "cache" / "k").iterdir()) if (tmp_path / "cache" / "k").exists() else True
    assert s.cached("k", {"a": 1}) is None
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]
