"""Whole tiny runs against the store's promises: typed manifests pinned to their recipe, cache keys that see code and
toolchain, damaged cache entries rebuilt, tampered publications caught, failed rebuilds that keep the last good
shelf, one writer, and nothing half-written after a kill, a SIGTERM or a full disk."""
import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from omni_export.artifacts import atomic, provenance
from omni_export.artifacts.hashing import hash_file
from omni_export.artifacts.manifest_schema import Manifest
from omni_export.commands.cli import main
from omni_export.errors import EXIT_IO, EXIT_OK
from omni_export.recipes import load_recipe, parse_recipe

from store_helpers import W8A16_BAR, manifest, temporaries, tiny_recipe_data, tree

AIDS = ("decode_step.fp32.onnx", "decode_step.w8a16.qdq_onnx")
REPO = Path(__file__).resolve().parents[2]


def _cli(*argv, cwd=None, env=None, **kw):
    return subprocess.Popen([sys.executable, "-m", "omni_export.commands.cli", *map(str, argv)], cwd=cwd,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def _error_line(err: str) -> str:
    """The command's one error line (stderr also carries the stage log above it)."""
    (line,) = [x for x in err.strip().splitlines() if x.startswith("omni-export:")]
    assert err.strip().splitlines()[-1] == line
    return line


def _entries(store, kind):
    return sorted(p.name for p in (store / "cache" / kind).iterdir() if not p.name.startswith("."))


def test_manifest_is_typed_and_pins_the_recipe(built_store, tiny_yaml):
    r = load_recipe(str(tiny_yaml))
    for aid in AIDS:
        m = manifest(built_store, aid)
        Manifest.model_validate(m)  # unknown keys are errors: what the pipeline writes is exactly the schema
        assert m["recipe_hash"] == m["recipe"]["hash"] == r.hash
        pinned = parse_recipe(yaml.safe_load((built_store / m["recipe"]["file"]).read_text()), "pin")
        assert pinned.hash == r.hash
        key = m["thresholds_key"]
        assert m["thresholds"] == [t.to_dict() for t in pinned.thresholds[key]]
        assert m["source"] == provenance.source_fingerprint() and len(m["source"]["sha256"]) == 64
        assert m["parity"]["asked_steps"] == m["parity"]["metrics"]["steps"] == 10  # 1 prompt: 7 + 4 steps, less the sink
    assert main(["gate", "--store", str(built_store)]) == EXIT_OK


def test_published_files_are_private_copies(built_store):
    pub = built_store / "published" / "tiny_store" / AIDS[0]
    cached = {p.name: p for p in (built_store / "cache" / "export-onnx").glob("*/model.onnx*")}
    for fn in ("model.onnx", "model.onnx.data"):
        assert (pub / fn).stat().st_nlink == 1 and cached[fn].stat().st_nlink == 1
        assert (pub / fn).stat().st_ino != cached[fn].stat().st_ino and hash_file(pub / fn) == hash_file(cached[fn])


def test_changing_one_line_of_a_model_misses_every_cache(store_copy, tiny_yaml, tmp_path, monkeypatch):
    """The source fingerprint is part of every step key: a one-line edit of the model's module (in a copy of the
    package) rebuilds the fp32 reference, the calibration set and both exports."""
    before = {k: _entries(store_copy, k) for k in ("reference", "calibration", "export-onnx", "export-qdq_onnx")}
    assert all(len(v) == 1 for v in before.values())
    pkg = tmp_path / "pkg"
    shutil.copytree(provenance.PACKAGE_ROOT, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    model = next(p for p in sorted(pkg.rglob("*.py")) if "spark" in p.as_posix() and p.name == "model.py")
    model.write_text(model.read_text() + "\n# one more line\n")
    monkeypatch.setattr(provenance, "PACKAGE_ROOT", pkg)
    assert main(["recipe", str(tiny_yaml), "--store", str(store_copy)]) == EXIT_OK
    after = {k: _entries(store_copy, k) for k in before}
    assert all(len(after[k]) == 2 and set(before[k]) < set(after[k]) for k in before), after


def test_another_onnxruntime_version_misses_the_cache(store_copy, tiny_yaml, monkeypatch):
    import omni_export.pipeline as pipeline

    real = provenance.toolchain()
    monkeypatch.setattr(pipeline, "toolchain", lambda: {**real, "onnxruntime": "0.0.1"})
    before = _entries(store_copy, "export-onnx")
    assert main(["recipe", str(tiny_yaml), "--store", str(store_copy)]) == EXIT_OK
    assert len(_entries(store_copy, "export-onnx")) == len(before) + 1
    assert manifest(store_copy)["toolchain"]["onnxruntime"] == "0.0.1"


def test_a_tampered_publication_fails_the_gate_and_the_next_run_restores_it(store_copy, tiny_yaml):
    pub = store_copy / "published" / "tiny_store" / AIDS[0] / "model.onnx.data"
    good = hash_file(pub)
    raw = bytearray(pub.read_bytes())
    raw[1000] ^= 0x01
    pub.write_bytes(bytes(raw))
    assert main(["gate", "--store", str(store_copy)]) == 1
    assert main(["recipe", str(tiny_yaml), "--store", str(store_copy)]) == EXIT_OK  # the cache was never touched
    assert hash_file(pub) == good == manifest(store_copy)["artifact"]["files"]["model.onnx.data"]["sha256"]
    assert main(["gate", "--store", str(store_copy)]) == EXIT_OK


def test_a_damaged_cache_entry_is_rebuilt_not_republished(store_copy, tiny_yaml):
    (entry,) = (store_copy / "cache" / "export-onnx").iterdir()
    good = hash_file(entry / "model.onnx.data")
    raw = bytearray((entry / "model.onnx.data").read_bytes())
    raw[1000] ^= 0x01
    (entry / "model.onnx.data").write_bytes(bytes(raw))
    done = (entry / ".done").stat().st_mtime_ns
    assert main(["recipe", str(tiny_yaml), "--store", str(store_copy)]) == EXIT_OK
    assert (entry / ".done").stat().st_mtime_ns != done  # evicted and built again
    assert hash_file(entry / "model.onnx.data") == good  # same bytes as the first build: the export is deterministic
    assert manifest(store_copy)["artifact"]["files"]["model.onnx.data"]["sha256"] == good
    assert main(["gate", "--store", str(store_copy)]) == EXIT_OK


def _failing_second_export(monkeypatch, error):
    """The run's second export raises ``error``: the first artifact is built, verified and staged before it."""
    import omni_export.pipeline as pipeline

    real, calls = pipeline.Pipeline._build, []

    def build(self, comp, target, scheme):
        calls.append(target.name)
        if len(calls) == 2:
            raise error
        return real(self, comp, target, scheme)

    monkeypatch.setattr(pipeline.Pipeline, "_build", build)
    return calls


@pytest.mark.parametrize("error,code", [
    ("unsupported", 4),
    ("disk full", EXIT_IO),
])
def test_a_failed_rebuild_keeps_the_last_good_shelf(store_copy, tiny_yaml, monkeypatch, capsys, error, code):
    """A rebuild that stops half-way (the graph refused, the disk full on a warm store) leaves every publication of
    the last finished run where it was, byte for byte, and nothing in ``retracted/``; the gate still passes."""
    from omni_export.errors import StoreIOError, UnsupportedError

    before = tree(store_copy)
    err = UnsupportedError("qdq_onnx refused the graph (injected)") if error == "unsupported" else \
        StoreIOError("disk full while writing the export (injected)")
    calls = _failing_second_export(monkeypatch, err)
    assert main(["recipe", str(tiny_yaml), "--store", str(store_copy)]) == code
    assert "(injected)" in capsys.readouterr().err and len(calls) == 2
    shelves = {k: v for k, v in tree(store_copy).items() if k.startswith(("published/", "blocked/", "unverified/"))}
    assert shelves == {k: v for k, v in before.items() if k.startswith(("published/", "blocked/", "unverified/"))}
    assert not (store_copy / "retracted").exists() and temporaries(store_copy) == []
    assert main(["gate", "--store", str(store_copy)]) == EXIT_OK
    monkeypatch.undo()
    assert main(["recipe", str(tiny_yaml), "--store", str(store_copy)]) == EXIT_OK
    assert main(["gate", "--store", str(store_copy)]) == EXIT_OK


def test_a_threshold_that_names_no_output_fails_before_any_work(store_copy, tmp_path, capsys):
    d = tiny_recipe_data()
    d["thresholds"]["w8a16"] = [{**W8A16_BAR[0], "outputs": "logitz"}]
    p = tmp_path / "tiny_store.yaml"
    p.write_text(yaml.safe_dump(d))
    before = tree(store_copy)
    assert main(["recipe", str(p), "--store", str(store_copy)]) == 2
    err = _error_line(capsys.readouterr().err)
    assert "thresholds for decode_step/w8a16: snr_db on outputs 'logitz' matches no output of decode_step" in err
    assert tree(store_copy) == before


def test_bad_input_leaves_even_the_temporaries(store_copy, tiny_yaml, tmp_path, capsys):
    """Stale temporaries go only once the run's inputs are valid, and only the store's own: a ``.tmp-*`` name outside
    the directories the store writes, or not of the form the store gives them, is never removed."""
    stale = store_copy / "cache" / "export-onnx" / ".tmp-abcd-0123abcd"
    stale.mkdir()
    mine = [store_copy / "notes" / ".tmp-draft-0123abcd", store_copy / "cache" / ".tmp-keep"]
    for f in mine:
        f.parent.mkdir(exist_ok=True)
        f.write_text("user file")
    bad = tmp_path / "ckpt"
    bad.mkdir()
    (bad / "config.json").write_text("{}")
    assert main(["recipe", str(tiny_yaml), "--store", str(store_copy), "--checkpoint", str(bad)]) == 2
    capsys.readouterr()
    assert stale.is_dir() and all(f.read_text() == "user file" for f in mine)
    assert main(["recipe", str(tiny_yaml), "--store", str(store_copy)]) == EXIT_OK
    assert not stale.exists() and all(f.read_text() == "user file" for f in mine)


def _fail_fsync_for(suffix):
    real = os.fsync

    def fsync(fd):
        if os.readlink(f"/proc/self/fd/{fd}").split("/")[-1].startswith(".tmp-" + suffix):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)
    return fsync


def test_disk_full_while_writing_the_report_is_exit_5_and_no_empty_report(store_copy, tiny_yaml, monkeypatch, capsys):
    monkeypatch.setattr(atomic.os, "fsync", _fail_fsync_for("report.md"))
    runs_before = sorted((store_copy / "runs" / "tiny_store").glob("*/report.md"))
    assert main(["recipe", str(tiny_yaml), "--store", str(store_copy)]) == EXIT_IO
    err = _error_line(capsys.readouterr().err)
    assert "disk full while writing" in err and "report.md" in err
    assert sorted((store_copy / "runs" / "tiny_store").glob("*/report.md")) == runs_before
    assert temporaries(store_copy) == []


@pytest.mark.parametrize("raised,says", [
    (OSError(errno.ENOSPC, "No space left on device"), "disk full while writing the ONNX export of graph"),
    # numpy's tofile (the exporter's external data) reports a full disk as a short write, without an errno
    (RuntimeError("saving failed"), "cannot write"),
    (OSError(errno.EIO, "Input/output error"), "cannot write"),
], ids=["ENOSPC", "short write", "EIO"])
def test_disk_full_during_onnx_export_is_exit_5(tmp_path, tiny_yaml, monkeypatch, capsys, raised, says):
    from torch.onnx._internal.exporter import _onnx_program

    def full(self, *a, **k):
        if isinstance(raised, RuntimeError):
            try:
                raise OSError("131072 requested and 82688 written")
            except OSError:
                raise raised
        raise raised

    monkeypatch.setattr(_onnx_program.ONNXProgram, "save", full)
    store = tmp_path / "store"
    assert main(["recipe", str(tiny_yaml), "--store", str(store)]) == EXIT_IO
    err = _error_line(capsys.readouterr().err)
    assert says in err
    assert not (store / "published").exists() and temporaries(store) == []


BAD_EDITS = {
    "simulator_steps": lambda d: d["parity"].update(simulator_steps="x"),
    "min_high": lambda d: d["thresholds"]["w8a16"][0].update(min="high"),
    "reason_5": lambda d: d["thresholds"]["w8a16"][0].update(reason=5),
    "seed_abc": lambda d: d["model"].update(seed="abc"),
    "threshold_list_5": lambda d: d["thresholds"].update(w8a16=5),
    "unknown_option": lambda d: d.update(options={"decode_step": {"partz": 2}}),
}


def test_bad_inputs_leave_the_store_exactly_as_it_was(store_copy, tmp_path, capsys):
    before = tree(store_copy)
    for name, edit in BAD_EDITS.items():
        d = tiny_recipe_data()
        edit(d)
        p = tmp_path / f"{name}.yaml"
        p.write_text(yaml.safe_dump(d))
        assert main(["recipe", str(p), "--store", str(store_copy)]) == 2, name
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(p) in err, err
    latin = tmp_path / "latin1.yaml"
    latin.write_bytes(yaml.safe_dump(tiny_recipe_data()).replace("description: ", "description: caf\u00e9 ", 1)
                      .encode("latin-1"))
    assert main(["recipe", str(latin), "--store", str(store_copy)]) == 2
    assert "not UTF-8" in capsys.readouterr().err
    assert tree(store_copy) == before
    assert main(["gate", "--store", str(store_copy)]) == EXIT_OK


def test_a_bad_checkpoint_config_is_one_line_and_leaves_the_store_as_it_was(store_copy, tiny_yaml, tmp_path, capsys):
    import json
    ckpt = tmp_path / "ckpt"
    assert main(["checkpoint", str(ckpt)]) == EXIT_OK
    cfg = json.loads((ckpt / "config.json").read_text())
    before = tree(store_copy)
    for name, bad in {"hidden_size_text": ({**cfg, "hidden_size": "big"}, "hidden_size='big' must be a positive"),
                      "no_hidden_size": ({k: v for k, v in cfg.items() if k != "hidden_size"}, "no hidden_size"),
                      "layers_vs_types": ({**cfg, "num_hidden_layers": 3}, "layer_types has 4 entries"),
                      "a_list": ([cfg], "ckpt")}.items():
        bad, says = bad
        (ckpt / "config.json").write_text(json.dumps(bad))
        code = main(["recipe", str(tiny_yaml), "--store", str(store_copy), "--checkpoint", str(ckpt)])
        err = _error_line(capsys.readouterr().err)
        # one line naming the checkpoint and the config.json field
        assert code == 2 and err.startswith("omni-export: checkpoint: checkpoint ") and "ckpt" in err, (name, err)
        assert says in err, (name, err)
    assert tree(store_copy) == before
    assert main(["gate", "--store", str(store_copy)]) == EXIT_OK


def _frozen_package(tmp_path) -> dict:
    """A copy of the package for subprocesses that must see the same source fingerprint (this working tree may be
    edited while the test runs)."""
    shutil.copytree(REPO / "omni_export", tmp_path / "pkg" / "omni_export", ignore=shutil.ignore_patterns("__pycache__"))
    return {"PYTHONPATH": str(tmp_path / "pkg")}


def test_two_concurrent_runs_one_waits_and_each_step_is_built_once(tmp_path, tiny_yaml):
    store, env = tmp_path / "store", _frozen_package(tmp_path)
    first = _cli("recipe", tiny_yaml, "--store", store, env=env)
    while not (store / "cache").exists():  # the first holds the lock once it writes
        time.sleep(0.1)
    second = _cli("recipe", tiny_yaml, "--store", store, env=env)
    busy = _cli("recipe", tiny_yaml, "--store", store, "--no-wait", env=env)
    assert busy.wait(120) == EXIT_IO and "is being written by another omni-export run" in busy.communicate()[1]
    assert first.wait(300) == EXIT_OK and second.wait(300) == EXIT_OK
    # the log wraps the message where the store's path leaves it (the test's own path length): compare it unwrapped
    assert "waiting for it to finish" in " ".join(second.communicate()[1].split())
    assert all(len(_entries(store, k)) == 1 for k in ("reference", "calibration", "export-onnx", "export-qdq_onnx"))
    assert temporaries(store) == [] and main(["gate", "--store", str(store)]) == EXIT_OK


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killed_mid_write_then_rerun_leaves_no_temporaries(tmp_path, tiny_yaml, sig):
    store = tmp_path / "store"
    p = _cli("recipe", tiny_yaml, "--store", store)
    deadline = time.monotonic() + 120
    while not list((store / "cache").glob("export-*/.tmp-*")) and time.monotonic() < deadline:
        time.sleep(0.05)  # an export is being written
    p.send_signal(sig)
    code = p.wait(60)
    err = p.communicate()[1]
    if sig == signal.SIGTERM:  # unwound like Ctrl-C: its own temporaries removed on the way out
        assert code == 143 and "terminated (SIGTERM)" in err and temporaries(store) == [], (code, err[-2000:])
    else:
        assert code == -signal.SIGKILL
    assert main(["recipe", str(tiny_yaml), "--store", str(store)]) == EXIT_OK
    assert temporaries(store) == [] and main(["gate", "--store", str(store)]) == EXIT_OK

