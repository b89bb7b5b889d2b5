"""Whole recipes through the CLI on the tiny preset: real exports, real runtimes, the real gate.

These are the slow tests (a few minutes in all). The first reads the session's shared ``spark_w8a16`` store (built
once for every test that reads it, ``tests/shared_stores.py``); the others work on one copy of it, so the fp32
reference and exports are built once, and the second spark_w8a16 run checks that a rerun resumes from finished
steps."""
import json

import pytest

from shared_stores import copy_store

from omni_export.commands.cli import main
from omni_export.errors import EXIT_BLOCKED, EXIT_OK

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def shared(shared_store):
    return shared_store("spark_w8a16")


@pytest.fixture(scope="module")
def store(shared, tmp_path_factory):
    return copy_store(shared.path, tmp_path_factory.mktemp("e2e") / "store")


def _latest(store, recipe):
    return json.loads((store / "runs" / recipe / "latest.json").read_text())


def test_spark_w8a16_publishes_a_verified_context_binary(shared):
    store = shared.path  # ``omni-export recipe spark_w8a16 --store S``, as the shared store was built
    assert shared.exit_code == EXIT_OK
    assert "parity against eager fp32" in shared.out  # the summary table
    rep = _latest(store, "spark_w8a16")
    arts = {a["id"]: a for a in rep["artifacts"]}
    assert all(a["status"] == "pass" for a in arts.values())
    assert set(arts) >= {"prefill.fp32.onnx", "prefill.w8a16.qdq_onnx", "prefill.w8a16.qnn_context.sm8750"}

    fp32 = arts["decode_step.fp32.onnx"]
    assert all(o["snr_db"] >= 100 for o in fp32["parity"]["outputs"].values())
    assert fp32["parity"]["lm"]["greedy_agreement"] == 1.0 and fp32["parity"]["lm"]["greedy_positions"] == 4 * 32

    ctx = arts["decode_step.w8a16.qnn_context.sm8750"]
    assert ctx["runtime"].startswith("qnn-htp-simulator")
    assert set(ctx["three_way_snr_db"]) == {"fp32 vs onnxruntime-cpu (QDQ)",
                                            "onnxruntime-cpu (QDQ) vs qnn-htp-simulator (SM8750)",
                                            "fp32 vs qnn-htp-simulator (SM8750)"}
    d = store / "published" / "spark_w8a16" / "decode_step.w8a16.qnn_context.sm8750"
    assert (d / "model_ctx.onnx").exists() and list(d.glob("*.bin"))
    m = json.loads((d / "manifest.json").read_text())
    assert m["verdict"]["status"] == "pass"
    assert m["target"]["device"]["chipset"] == "SM8750" and m["target"]["device"]["soc_model"] == 69
    for key in ("weights_hash", "config_hash"):
        assert len(m["model"][key]) == 64
    assert len(m["calibration"]["hash"]) == 64 and m["calibration"]["samples"] > 0
    assert m["scheme"]["name"] == "w8a16" and m["scheme"]["weights"] == "int8"
    assert m["toolchain"]["onnxruntime-qnn"] and m["toolchain"]["torch"].startswith("2.13")
    assert "sha" in m["source_revision"]
    rep = _latest(store, "spark_w8a16")  # every stage reports its wall time and its own peak memory
    assert set(rep["peak_rss_bytes"]) == set(rep["timings_s"])
    assert all(50 * 2**20 < v < 8 * 2**30 for v in rep["peak_rss_bytes"].values())
    assert all(t["reason"] for t in m["thresholds"])
    from omni_export.artifacts.hashing import hash_file
    for fn, meta in m["artifact"]["files"].items():
        assert hash_file(d / fn) == meta["sha256"]


def test_rerun_resumes_from_finished_steps(store):
    before = {p: p.stat().st_mtime_ns for p in (store / "cache").rglob(".done")}
    assert main(["recipe", "spark_w8a16", "--store", str(store)]) == EXIT_OK
    after = {p: p.stat().st_mtime_ns for p in (store / "cache").rglob(".done")}
    assert all(after[p] == t for p, t in before.items())  # nothing finished was rebuilt
    rep = _latest(store, "spark_w8a16")
    assert rep["timings_s"]["export decode_step qdq_onnx/w8a16"] < 1.0


@pytest.mark.parametrize("recipe", ["spark_w8a8", "spark_w4a16_uncalibrated"])
def test_broken_schemes_are_blocked_and_never_published(store, recipe, capsys):
    assert main(["recipe", recipe, "--store", str(store)]) == EXIT_BLOCKED
    assert "BLOCKED" in capsys.readouterr().out
    assert not (store / "published" / recipe).exists()
    blocked = list((store / "blocked" / recipe).glob("*/manifest.json"))
    assert blocked
    for mf in blocked:
        m = json.loads(mf.read_text())
        assert m["verdict"]["status"] == "blocked"
        assert any("required >=" in r for r in m["verdict"]["reasons"])


def test_spark_fp16_on_the_htp_simulator(store):
    assert main(["recipe", "spark_fp16", "--store", str(store), "--device", "galaxy_s24"]) == EXIT_OK
    rep = _latest(store, "spark_fp16")
    ctx = next(a for a in rep["artifacts"] if a["id"].endswith("qnn_context.sm8650"))
    assert ctx["status"] == "pass" and ctx["parity"]["outputs"]["logits"]["snr_db"] >= 45


def test_two_checkouts_build_byte_identical_artifacts_on_every_target(tmp_path):
    """The tiny decode step through fp32 ONNX, w8a16 QDQ and the w8a16 QNN context binary, built by two copies of
    the package in different directories (as two clones would be) into two stores: every artifact file has the same
    sha256, and no graph holds a local path or a stack trace."""
    import os
    import shutil
    import subprocess
    import sys
    from importlib import resources
    from pathlib import Path

    import yaml

    d = yaml.safe_load(resources.files("omni_export.recipes").joinpath("spark_w8a16.yaml").read_text())
    d.update(name="two_clones", components=["decode_step"], options={}, presets={},
             calibration={"max_samples": 16, "new_tokens": 8}, parity={"new_tokens": 4, "max_prompts": 1,
                                                                     "simulator_steps": 4})
    d["thresholds"] = {"fp32": d["thresholds"]["fp32"], "w8a16": [{**t, "min": 0} for t in d["thresholds"]["w8a16"]]}
    d["builds"] = [b for b in d["builds"] if b["target"] != "genie"]  # the three targets of the docstring
    recipe = tmp_path / "two_clones.yaml"
    recipe.write_text(yaml.safe_dump(d))
    repo = Path(__file__).resolve().parents[1]
    files = []
    for where in ("a", "b/a/much/longer/path"):
        clone = tmp_path / where
        shutil.copytree(repo / "omni_export", clone / "omni_export", ignore=shutil.ignore_patterns("__pycache__"))
        p = subprocess.run([sys.executable, "-m", "omni_export.commands.cli", "recipe", str(recipe), "--store",
                            str(clone / "s")], cwd=clone, env={**os.environ, "PYTHONPATH": str(clone)}, capture_output=True, text=True)
        assert p.returncode in (EXIT_OK, EXIT_BLOCKED), p.stderr
        found = {}
        for mf in sorted((clone / "s").glob("*/two_clones/*/manifest.json")):
            m = json.loads(mf.read_text())
            found[m["artifact"]["id"]] = {fn: meta["sha256"] for fn, meta in m["artifact"]["files"].items()}
        files.append(found)
    assert set(files[0]) == {"decode_step.fp32.onnx", "decode_step.w8a16.qdq_onnx", "decode_step.w8a16.qnn_context.sm8750"}
    assert files[0] == files[1]
    for graph in (clone / "s").glob("published/two_clones/*/*.onnx"):  # no local path or stack trace in any graph
        blob = graph.read_bytes()
        assert str(clone).encode() not in blob and b"stack_trace" not in blob, graph
