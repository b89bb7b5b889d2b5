"""The store: atomic files and directories, resumable steps re-hashed before reuse, shelves that never leave a stale
publication and never share bytes with the cache, one writer at a time, full disk."""
import errno
import json
import subprocess
import sys
import textwrap
import time

import pytest

from omni_export.artifacts import atomic
from omni_export.artifacts.store import Store, atomic_dir, shelf_for, write_json_atomic
from omni_export.errors import StoreBusy, StoreIOError


def _files(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and p.name != ".lock")


def test_atomic_dir_leaves_nothing_on_failure(tmp_path):
    final = tmp_path / "a" / "step"
    with pytest.raises(RuntimeError):
        with atomic_dir(final) as tmp:
            (tmp / "half.bin").write_bytes(b"x" * 10)
            raise RuntimeError("boom")
    assert not final.exists()
    assert list((tmp_path / "a").iterdir()) == []


def test_atomic_dir_replaces_an_existing_directory_whole(tmp_path):
    final = tmp_path / "d"
    for content in (b"old", b"new"):
        with atomic_dir(final) as tmp:
            (tmp / "f").write_bytes(content)
    assert (final / "f").read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["d"]  # no .tmp-* or old copy left beside it


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


def test_file_hashes_come_from_the_record_only_where_this_run_hashed_the_entry(tmp_path, monkeypatch):
    """``Store.file_hashes``: a step this store object built (or re-checked whole) gives the sha256 its DONE record
    holds without reading the files again; another store object (a new run) reads them afresh, so a file changed
    since is seen."""
    from omni_export.artifacts import store as store_mod
    from omni_export.artifacts.hashing import hash_file

    s = Store(tmp_path)
    d, _ = s.run_step("k", {"a": 1}, lambda out: (out / "m.onnx").write_bytes(b"graph"))
    read = []
    monkeypatch.setattr(store_mod, "hash_file", lambda p: read.append(p) or hash_file(p))
    assert s.file_hashes(d, [d / "m.onnx"]) == {"m.onnx": hash_file(d / "m.onnx")} and read == []
    (d / "m.onnx").write_bytes(b"other")
    assert Store(tmp_path).file_hashes(d, [d / "m.onnx"]) == {"m.onnx": hash_file(d / "m.onnx")}
    assert read == [d / "m.onnx"]


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


@pytest.mark.parametrize("damage", ["flip", "delete", "extra"])
def test_a_damaged_cache_entry_is_evicted_and_rebuilt(tmp_path, damage):
    calls = []

    def build(d):
        calls.append(1)
        (d / "w.bin").write_bytes(bytes(range(200)))

    d, _ = Store(tmp_path).run_step("k", {"a": 1}, build)
    if damage == "flip":
        raw = bytearray((d / "w.bin").read_bytes())
        raw[17] ^= 0xFF
        (d / "w.bin").write_bytes(bytes(raw))
    elif damage == "delete":
        (d / "w.bin").unlink()
    else:
        (d / "stray.so").write_bytes(b"\x7fELF")
    s = Store(tmp_path)  # a new run: nothing is taken on trust from the last one
    assert s.cached("k", {"a": 1}) is None
    d2, reused = s.run_step("k", {"a": 1}, build)
    assert (d2, reused, len(calls)) == (d, False, 2)
    assert (d2 / "w.bin").read_bytes() == bytes(range(200)) and not (d2 / "stray.so").exists()
    assert json.loads((d2 / ".done").read_text())["w.bin"] == atomic_hash(d2 / "w.bin")


def atomic_hash(p):
    from omni_export.artifacts.hashing import hash_file
    return hash_file(p)


def test_an_entry_from_before_hashes_were_recorded_is_rebuilt(tmp_path):
    d, _ = Store(tmp_path).run_step("k", {"a": 1}, lambda d: (d / "x").write_text("1"))
    (d / ".done").write_text("")  # what older stores hold
    assert Store(tmp_path).run_step("k", {"a": 1}, lambda d: (d / "x").write_text("1"))[1] is False


def test_place_moves_between_shelves_and_copies_never_links(tmp_path):
    s = Store(tmp_path)
    d, _ = s.run_step("export", {"a": 1}, lambda d: (d / "model.onnx").write_bytes(b"onnx"))
    src = d / "model.onnx"
    pub = s.place("published", "r", "art", {"model.onnx": src}, {"verdict": {"status": "pass"}})
    assert (pub / "model.onnx").read_bytes() == b"onnx"
    assert (pub / "model.onnx").stat().st_ino != src.stat().st_ino and src.stat().st_nlink == 1
    (pub / "model.onnx").write_bytes(b"tampered")  # an edit of the published file leaves the cache entry intact
    assert src.read_bytes() == b"onnx" and Store(tmp_path).cached("export", {"a": 1}) == d
    s.place("blocked", "r", "art", {"model.onnx": src}, {"verdict": {"status": "blocked"}})
    assert not (tmp_path / "published/r/art").exists()
    assert json.loads((tmp_path / "blocked/r/art/manifest.json").read_text())["verdict"]["status"] == "blocked"
    assert not [p for p in tmp_path.rglob(".tmp-*")]


def test_one_verdict_to_shelf_map():
    from omni_export.parity import gate
    shelves = {s: shelf_for(s) for s in (gate.PASS, gate.BLOCKED, gate.UNVERIFIED)}  # every verdict the gate gives
    assert shelves[gate.PASS] == "published" and len(set(shelves.values())) == 3  # only a pass is published
    with pytest.raises(ValueError, match="unknown verdict status 'passed'"):
        shelf_for("passed")


def test_staged_artifacts_reach_their_shelves_only_when_published(tmp_path):
    s, f = Store(tmp_path), tmp_path / "m.onnx"
    f.write_bytes(b"new")
    old = s.place("published", "r", "art", {"m.onnx": f}, {"verdict": {"status": "pass"}, "v": 1})
    (tmp_path / "retracted/r/art").mkdir(parents=True)  # what an older store left for this artifact
    with s.writer():
        staged = [s.stage("blocked", "r", "art", {"m.onnx": f}, {"verdict": {"status": "blocked"}}),
                  s.stage("published", "r", "other", {"m.onnx": f}, {"verdict": {"status": "pass"}})]
        assert json.loads((old / "manifest.json").read_text())["v"] == 1  # staged: nothing moved yet
        assert not (tmp_path / "published/r/other").exists() and not (tmp_path / "blocked/r/art").exists()
        finals = s.publish(staged)
    assert finals == [tmp_path / "blocked/r/art", tmp_path / "published/r/other"]
    assert not old.exists() and not (tmp_path / "retracted/r").exists()
    assert (tmp_path / "blocked/r/art/m.onnx").read_bytes() == b"new" and not list(tmp_path.rglob(".tmp-*"))
    with s.writer():
        s.discard([s.stage("published", "r", "third", {"m.onnx": f}, {})])
    assert not list(tmp_path.rglob(".tmp-*")) and not (tmp_path / "published/r/third").exists()


@pytest.mark.parametrize("recipe,artifact", [("..", "a"), ("r", "../../x"), ("", "a"), ("r", "a/b"), ("r", "a\0b")])
def test_a_shelf_never_takes_a_name_that_is_a_path(tmp_path, recipe, artifact):
    from omni_export.errors import BadInput

    with pytest.raises(BadInput, match="name"):
        Store(tmp_path / "s").shelf_dir("published", recipe, artifact)
    assert not (tmp_path / "s").exists()


def _full(*a, **k):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_full_disk_is_a_clear_error_and_leaves_nothing(tmp_path, monkeypatch):
    s = Store(tmp_path)
    monkeypatch.setattr(atomic, "_fsync_tree", _full)
    with pytest.raises(StoreIOError, match="disk full while writing"):
        s.run_step("k", {"a": 1}, lambda d: (d / "big").write_bytes(b"0" * 100))
    assert s.cached("k", {"a": 1}) is None
    assert list((tmp_path / "cache" / "k").iterdir()) == []  # not even a temporary directory
    assert _files(tmp_path) == []


def test_atomic_file_write_on_a_full_disk_keeps_the_old_file(tmp_path, monkeypatch):
    p = tmp_path / "runs" / "report.md"
    write_json_atomic(p, {"v": 1})
    monkeypatch.setattr(atomic.os, "fsync", _full)
    with pytest.raises(StoreIOError, match=r"disk full while writing .*report\.md"):
        atomic.write_text_atomic(p, "# a report\n" * 1000)
    assert json.loads(p.read_text()) == {"v": 1}
    assert _files(tmp_path) == ["runs/report.md"]


HOLD = textwrap.dedent("""
    import sys, time
    from omni_export.artifacts.store import Store
    with Store(sys.argv[1]).writer():
        print("locked", flush=True)
        time.sleep(float(sys.argv[2]))
""")


def _holder(root, seconds):
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(root), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "locked"
    return p


def test_a_second_writer_fails_at_once_or_waits_with_a_message(tmp_path):
    holder = _holder(tmp_path, 3)
    try:
        with pytest.raises(StoreBusy, match="is being written by another omni-export run; wait for it"):
            with Store(tmp_path).writer(wait=False):
                pass
        said, t0 = [], time.monotonic()
        with Store(tmp_path).writer(on_wait=said.append):
            waited = time.monotonic() - t0
        assert said == [f"store {tmp_path} is being written by another omni-export run; waiting for it to finish"]
        assert waited > 0.5
    finally:
        holder.kill()
        holder.wait()


def test_the_first_writer_removes_what_a_killed_one_left(tmp_path):
    (tmp_path / "cache" / "export-onnx" / ".tmp-abc-12345678").mkdir(parents=True)
    (tmp_path / "cache" / "export-onnx" / ".tmp-abc-12345678" / "model.onnx").write_bytes(b"half")
    (tmp_path / "runs" / "r").mkdir(parents=True)
    (tmp_path / "runs" / "r" / ".tmp-latest.json-1234abcd").write_text("{")
    (tmp_path / "runs" / "r" / "latest.json").write_text("{}")
    with Store(tmp_path).writer():
        assert not list(tmp_path.rglob(".tmp-*"))
    assert (tmp_path / "runs" / "r" / "latest.json").read_text() == "{}"


def test_only_the_stores_own_temporaries_are_swept(tmp_path):
    """A ``--store`` given a directory that holds other things: only ``temp_path`` names, only in the directories the
    store writes, are removed; a user's ``.tmp-*`` elsewhere (or of another form) stays, and no link is followed."""
    ours = [tmp_path / "cache" / "k" / ".tmp-abcd-0123abcd", tmp_path / "published" / "r" / ".tmp-art-89abcdef"]
    theirs = [tmp_path / "project" / ".tmp-notes-0123abcd", tmp_path / ".tmp-top-0123abcd",
              tmp_path / "cache" / ".tmp-keep", tmp_path / "outside" / ".tmp-x-0123abcd"]
    for f in ours + theirs:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("x")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "link").symlink_to(tmp_path / "outside", target_is_directory=True)
    with Store(tmp_path).writer():
        pass
    assert not any(f.exists() for f in ours) and all(f.read_text() == "x" for f in theirs)


WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from omni_export.artifacts.store import Store
    root, log, n, go = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
    while not go.exists():
        time.sleep(0.001)
    s, bad = Store(root), 0

    def build(d, k):
        with open(log, "a") as f:
            f.write(f"{k}\\n")
        (d / "v").write_text(str(k))

    for k in range(n):
        try:
            d, _ = s.run_step("k", {"k": k}, lambda d: build(d, k))
            bad += (d / "v").read_text() != str(k)
        except Exception:
            bad += 1
    print(bad)
""")


def test_two_writers_build_each_step_once_and_read_what_they_asked_for(tmp_path):
    """Two processes ask for the same new steps at the same time: the cache check and the build are one step under
    the writer lock, so each step is built once and neither caller finds it replaced under it."""
    n, go, log = 300, tmp_path / "go", tmp_path / "builds.log"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path / "s"), str(log), str(n), str(go)],
                              stdout=subprocess.PIPE, text=True, cwd=tmp_path) for _ in range(2)]
    go.touch()
    outs = [p.communicate(timeout=300)[0].strip() for p in procs]
    assert outs == ["0", "0"]
    built = log.read_text().split()
    assert sorted(map(int, built)) == list(range(n)), f"{len(built) - n} step(s) built twice"
