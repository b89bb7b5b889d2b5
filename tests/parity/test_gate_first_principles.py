"""The gate re-judges from first principles (issue 17): every way of fooling it that a skeptical user tried on a real
store (spark_fp16, tiny preset, the session store of conftest.py) fails, with a reason naming the file or key.

Each test mutates its own copy of the store; the figures asserted are read from the store itself."""
import json
import shutil

import pytest
import yaml

from omni_export.artifacts.hashing import hash_file, path_bytes
from omni_export.commands.cli import main
from omni_export.errors import EXIT_BLOCKED, EXIT_EXPECTATION, EXIT_OK

FP16 = "decode_step.fp16.qnn_context.sm8750"
FP32 = "decode_step.fp32.onnx"
PUB = ("published", "spark_fp16")

pytestmark = pytest.mark.slow


@pytest.fixture
def store(fp16_store, tmp_path):
    dst = tmp_path / "store"
    shutil.copytree(fp16_store, dst, ignore=shutil.ignore_patterns("cache"))
    return dst


def _dir(store, artifact, shelf="published"):
    return store / shelf / "spark_fp16" / artifact


def _load(store, artifact, shelf="published"):
    return json.loads((_dir(store, artifact, shelf) / "manifest.json").read_text())


def _save(store, artifact, m, shelf="published"):
    (_dir(store, artifact, shelf) / "manifest.json").write_text(json.dumps(m))


def _failures(store, tmp_path, *extra):
    """(exit code, {case name: failure message}) of the gate on ``store``."""
    out = tmp_path / "gate.json"
    code = main(["gate", "--store", str(store), "--json", str(out), *map(str, extra)])
    res = json.loads(out.read_text())
    return code, {f"{a['id']} :: {c['name']}": c["message"] for a in res["artifacts"] for c in a["cases"]
                  if c["status"] == "fail"}


def _run_reports(store):
    return sorted((store / "runs" / "spark_fp16").glob("*/report.json"))


def test_the_unmodified_store_passes(store, tmp_path):
    assert _failures(store, tmp_path) == (EXIT_OK, {})


def test_empty_thresholds_fail_against_the_pinned_recipe(store, tmp_path):
    m = _load(store, FP16)
    assert len(m["thresholds"]) == 2  # snr_db on every output, top-1 (recipes/spark_fp16.yaml)
    m["thresholds"] = []
    _save(store, FP16, m)
    code, failed = _failures(store, tmp_path)
    assert code == EXIT_BLOCKED and set(failed) == {f"{FP16} :: recipe"}
    assert "thresholds differ from the pinned recipe's for decode_step/fp16 (manifest 0, recipe 2" in \
        failed[f"{FP16} :: recipe"]


def test_a_blocked_artifact_moved_to_published_with_lowered_thresholds_fails(store, tmp_path):
    """The figures of a blocked build (logits at 30 dB, under the 45 dB bar), recorded consistently everywhere,
    its verdict rewritten to pass and its bar lowered to 25 dB: the pinned recipe still says 45."""
    m = _load(store, FP16)
    m["parity"]["metrics"]["outputs"]["logits"]["snr_db"] = 30.0
    for c in m["verdict"]["checks"]:
        if c["output"] == "logits":
            c["value"], c["ok"] = 30.0, True
    m["verdict"]["status"], m["verdict"]["reasons"] = "pass", []
    m["thresholds"][0]["min"] = 25.0
    _save(store, FP16, m)
    for rp in _run_reports(store):
        rep = json.loads(rp.read_text())
        for a in rep["artifacts"]:
            if a["id"] == FP16:
                a["parity"]["outputs"]["logits"]["snr_db"] = 30.0
        rp.write_text(json.dumps(rep))
    code, failed = _failures(store, tmp_path)
    assert code == EXIT_BLOCKED
    assert set(failed) == {f"{FP16} :: recipe", f"{FP16} :: verdict", f"{FP16} :: logits snr_db"}
    assert "thresholds differ from the pinned recipe's" in failed[f"{FP16} :: recipe"]
    assert "recomputed verdict 'blocked'" in failed[f"{FP16} :: verdict"]
    assert "published shelf" in failed[f"{FP16} :: verdict"]
    assert failed[f"{FP16} :: logits snr_db"] == "30 misses the threshold >= 45"


def test_a_parity_figure_edited_upward_fails(store, tmp_path):
    m = _load(store, FP16)
    snr = m["parity"]["metrics"]["outputs"]["logits"]["snr_db"]
    m["parity"]["metrics"]["outputs"]["logits"]["snr_db"] = snr + 20
    _save(store, FP16, m)
    code, failed = _failures(store, tmp_path)
    assert code == EXIT_BLOCKED and set(failed) == {f"{FP16} :: figures"}
    assert f"parity.metrics.outputs.logits.snr_db = {snr + 20!r} but the verdict's check records {snr!r}" in \
        failed[f"{FP16} :: figures"]
    # the verdict's check edited to match: the run report that measured it still disagrees
    for c in m["verdict"]["checks"]:
        if c["output"] == "logits" and c["metric"] == "snr_db":
            c["value"] = snr + 20
    _save(store, FP16, m)
    code, failed = _failures(store, tmp_path)
    report = _run_reports(store)[-1].relative_to(store)
    assert code == EXIT_BLOCKED and failed == {f"{FP16} :: figures": f"parity.metrics differ from what {report} "
                                                                     f"recorded for {FP16}"}


def test_a_deleted_manifest_fails_naming_the_directory(store, tmp_path):
    (_dir(store, FP32) / "manifest.json").unlink()
    code, failed = _failures(store, tmp_path)
    assert code == EXIT_BLOCKED and set(failed) == {f"{FP32} :: manifest"}
    assert failed[f"{FP32} :: manifest"].startswith(f"published/spark_fp16/{FP32}/manifest.json is missing: "
                                                    "the directory holds model.onnx, model.onnx.data")


def test_extra_files_in_a_published_directory_fail_naming_them(store, tmp_path):
    d = _dir(store, FP32)
    (d / "libstray.so").write_bytes(b"\x7fELF")
    shutil.copy(d / "model.onnx", d / "second.onnx")
    code, failed = _failures(store, tmp_path)
    assert code == EXIT_BLOCKED and set(failed) == {f"{FP32} :: files"}
    msg = failed[f"{FP32} :: files"]
    assert "libstray.so is not listed in the manifest" in msg and "second.onnx is not listed in the manifest" in msg


def test_an_mlpackage_directory_is_hashed_as_a_tree(store, tmp_path):
    d = _dir(store, FP32)
    pkg = d / "model.mlpackage"
    (pkg / "Data" / "weights").mkdir(parents=True)
    (pkg / "Manifest.json").write_text("{}")
    (pkg / "Data" / "weights" / "weight.bin").write_bytes(bytes(range(256)) * 4)
    m = _load(store, FP32)
    m["artifact"]["files"]["model.mlpackage"] = {"sha256": hash_file(pkg), "bytes": path_bytes(pkg), "role": "model"}
    _save(store, FP32, m)
    for rp in _run_reports(store):  # the run report binds the file hashes too
        rep = json.loads(rp.read_text())
        for a in rep["artifacts"]:
            if a["id"] == FP32:
                a["files"]["model.mlpackage"] = hash_file(pkg)
        rp.write_text(json.dumps(rep))
    assert path_bytes(pkg) == 2 + 1024
    assert _failures(store, tmp_path) == (EXIT_OK, {})  # a listed directory is neither missing nor extra
    w = pkg / "Data" / "weights" / "weight.bin"
    w.write_bytes(b"\x01" + w.read_bytes()[1:])  # one byte inside the tree
    code, failed = _failures(store, tmp_path)
    assert code == EXIT_BLOCKED and set(failed) == {f"{FP32} :: files"}
    assert failed[f"{FP32} :: files"].startswith("model.mlpackage was modified: sha256 ")
    w.write_bytes(b"\x00" + w.read_bytes()[1:])  # restored: the tree matches again
    assert _failures(store, tmp_path) == (EXIT_OK, {})
    (pkg / "Data" / "extra.bin").write_bytes(b"x")  # a file added inside the tree: its size tells, before any read
    assert _failures(store, tmp_path)[1][f"{FP32} :: files"] == "model.mlpackage has 1027 bytes, manifest says 1026"
    (pkg / "Data" / "extra.bin").unlink()
    (pkg / "Data" / "extra.bin").symlink_to(w)  # a symlink inside the tree is not a regular file
    assert _failures(store, tmp_path)[1][f"{FP32} :: files"] == \
        "model.mlpackage: Data/extra.bin inside it is a symlink, not a regular file"


def test_fewer_steps_than_asked_or_than_the_baseline_fail(store, tmp_path):
    m = _load(store, FP16)
    assert (m["parity"]["bounded_steps"], m["parity"]["asked_steps"], m["parity"]["metrics"]["steps"]) == (20, 20, 20)
    # every graph call of 4 sequences of 47 tokens: position 0 of each is the reference's (the sink), not a call
    assert _load(store, FP32)["parity"]["metrics"]["steps"] == _load(store, FP32)["parity"]["asked_steps"] == 184
    base = tmp_path / "baseline.json"
    assert main(["gate", "--store", str(store), "--baseline", str(base), "--write-baseline"]) == EXIT_OK

    # a trace that stopped after 12 steps, recorded consistently in the manifest and the run report
    m["parity"]["metrics"]["steps"] = 12
    _save(store, FP16, m)
    for rp in _run_reports(store):
        rep = json.loads(rp.read_text())
        for a in rep["artifacts"]:
            if a["id"] == FP16:
                a["parity"]["steps"] = 12
        rp.write_text(json.dumps(rep))
    code, failed = _failures(store, tmp_path, "--baseline", base)
    assert code == EXIT_BLOCKED and set(failed) == {f"{FP16} :: steps"}
    assert failed[f"{FP16} :: steps"] == ("parity.metrics.steps 12 measured, 20 asked (parity.asked_steps); "
                                          "parity.metrics.steps 12 != the baseline's 20 steps")

    # a store rebuilt with a smaller budget than the one its baseline was measured with (--simulator-steps 2)
    b = json.loads(base.read_text())
    b["artifacts"][f"spark_fp16/{FP32}"]["steps"] = 368
    base.write_text(json.dumps(b))
    code, failed = _failures(store, tmp_path, "--baseline", base)
    assert failed[f"{FP32} :: steps"] == "parity.metrics.steps 184 != the baseline's 368 steps"

    # the budget recorded is not the pinned recipe's
    m["parity"]["bounded_steps"] = 2
    _save(store, FP16, m)
    _, failed = _failures(store, tmp_path)
    assert "parity.bounded_steps 2 != the pinned recipe's simulator_steps 20" in failed[f"{FP16} :: steps"]


def test_a_missing_or_unknown_recipe_pin_fails(store, tmp_path):
    m = _load(store, FP32)
    del m["recipe_hash"]
    _save(store, FP32, m)
    code, failed = _failures(store, tmp_path)
    assert code == EXIT_BLOCKED and failed == {f"{FP32} :: manifest": f"published/spark_fp16/{FP32}/manifest.json: "
                                                                      "recipe_hash: Field required"}
    m["recipe_hash"] = m["recipe"]["hash"] = "0" * 64
    _save(store, FP32, m)
    _, failed = _failures(store, tmp_path)
    assert failed[f"{FP32} :: recipe"].startswith(f"recipe.hash: no recipe with the pinned hash {'0' * 12}…")


@pytest.fixture(scope="module")
def expect_blocked_store(shared_store, fp16_store):
    """A recipe that expects its artifacts blocked and builds a faithful fp32 graph: spark_fp16's fp32 build (its
    export reused from the spark_fp16 store's step cache; read-only: the gate only reads it)."""
    from importlib import resources

    d = yaml.safe_load(resources.files("omni_export.recipes").joinpath("spark_fp16.yaml").read_text())
    d.update(name="spark_expects_block", expect_blocked=True, builds=[{"target": "onnx", "scheme": "fp32"}],
             parity={**d.get("parity", {}), "new_tokens": 8})
    s = shared_store(d, seed=shared_store("spark_fp16", "--simulator-steps", "20"))
    assert s.exit_code == EXIT_EXPECTATION, s.out  # the run says so itself
    return s.path


def test_expect_blocked_is_enforced_with_its_own_exit_code(expect_blocked_store, tmp_path, capsys):
    code, failed = _failures(expect_blocked_store, tmp_path)
    assert code == EXIT_EXPECTATION == 7
    assert failed == {f"{FP32} :: expectation": "recipe spark_expects_block expects every artifact blocked "
                                                "(expect_blocked: true) and this one passes"}
    m = json.loads((expect_blocked_store / "published" / "spark_expects_block" / FP32 / "manifest.json").read_text())
    assert m["parity"]["metrics"]["outputs"]["logits"]["snr_db"] >= 100  # it really passes its fp32 bar
