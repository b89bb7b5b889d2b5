"""``omni-export gate`` on a real store (spark_fp16, tiny preset): file hashes, verdicts, thresholds, baseline, outputs.

Each test works on its own copy of the session store, so tampering in one never leaks into another."""
import json
import shutil
import time
import xml.etree.ElementTree as ET

import pytest

from omni_export.commands.cli import main
from omni_export.errors import EXIT_BAD_INPUT, EXIT_BLOCKED, EXIT_OK
from omni_export.audit.ci_gate import Tolerances, _verdict_case

FP16 = "decode_step.fp16.qnn_context.sm8750"
FP32 = "decode_step.fp32.onnx"


def _copy(store, tmp_path, cache=False):
    dst = tmp_path / "store"
    shutil.copytree(store, dst, ignore=None if cache else shutil.ignore_patterns("cache"))
    return dst


def _manifest_path(store, artifact):
    return store / "published" / "spark_fp16" / artifact / "manifest.json"


def _gate(store, *extra):
    return main(["gate", "--store", str(store), *map(str, extra)])


def _set_figure(store, artifact, output, value, metric="snr_db"):
    """Edit one figure consistently everywhere the store records it (manifest metrics, the verdict's check, the run
    report), as a real run measuring that value would have: only a rerun or a baseline can then tell."""
    def put(metrics):
        (metrics["lm"] if output == "lm" else metrics["outputs"][output])[metric] = value

    mp = _manifest_path(store, artifact)
    m = json.loads(mp.read_text())
    put(m["parity"]["metrics"])
    for c in m["verdict"]["checks"]:
        if c["output"] == output and c["metric"] == metric:
            c["value"] = value
    mp.write_text(json.dumps(m))
    for rp in (store / "runs" / "spark_fp16").glob("*/report.json"):
        rep = json.loads(rp.read_text())
        for a in rep["artifacts"]:
            if a["id"] == artifact:
                put(a["parity"])
        rp.write_text(json.dumps(rep))


def _junit(path):
    root = ET.parse(path).getroot()
    cases = root.findall(".//testcase")
    failed = {c.get("name"): c.find("failure").get("message") for c in cases if c.find("failure") is not None}
    return root, cases, failed


@pytest.mark.slow
def test_a_faithful_store_passes_and_every_output_parses(fp16_store, tmp_path):
    s = _copy(fp16_store, tmp_path)
    base = tmp_path / "baseline.json"
    assert _gate(s, "--baseline", base, "--write-baseline") == EXIT_OK
    b = json.loads(base.read_text())
    assert set(b["artifacts"]) == {f"spark_fp16/{FP16}", f"spark_fp16/{FP32}"}
    manifest = json.loads(_manifest_path(s, FP16).read_text())
    assert b["artifacts"][f"spark_fp16/{FP16}"]["figures"]["logits/snr_db"] == \
        manifest["parity"]["metrics"]["outputs"]["logits"]["snr_db"]

    out = {k: tmp_path / f"gate.{k}" for k in ("json", "xml", "md")}
    assert _gate(s, "--baseline", base, "--json", out["json"], "--junit", out["xml"], "--markdown", out["md"]) == EXIT_OK

    # JUnit: per artifact the store checks (files, recipe, steps, figures, verdict), then one case per output x
    # metric its recipe's thresholds name: fp16 has snr_db on every output ("*") and top-1; fp32 adds greedy and dlogp
    root, cases, failed = _junit(out["xml"])
    store_checks = ("files", "recipe", "steps", "figures", "verdict")
    expected = set()
    for a, lm in ((FP16, ("top1_agreement",)), (FP32, ("top1_agreement", "greedy_agreement", "max_logprob_delta"))):
        m = json.loads(_manifest_path(s, a).read_text())
        outputs = [o[0] for o in m["artifact"]["component"]["outputs"]]
        assert len(outputs) == 9  # logits + K/V rows of 4 layers (tiny preset)
        expected |= {f"{a} :: {c}" for c in store_checks} | {f"{a} :: {o} snr_db" for o in outputs}
        expected |= {f"{a} :: lm {x}" for x in lm}
    names = [c.get("name") for c in cases]
    assert sorted(names) == sorted(expected) and int(root.get("tests")) == len(expected) == 2 * 5 + 10 + 12
    assert not failed and root.get("failures") == "0"
    # every threshold case quotes the figure the run measured
    m16 = json.loads(_manifest_path(s, FP16).read_text())
    snr = m16["parity"]["metrics"]["outputs"]["logits"]["snr_db"]
    out_text = {c.get("name"): c.findtext("system-out") for c in cases}
    assert out_text[f"{FP16} :: logits snr_db"].startswith(f"{snr:.4g} >= 45")
    assert out_text[f"{FP16} :: steps"] == "20 step(s) measured as asked"

    res = json.loads(out["json"].read_text())
    assert res["ok"] and res["exit_code"] == 0 and res["counts"]["cases"] == len(expected)
    assert all(a["outcome"] == "pass" for a in res["artifacts"])
    md = out["md"].read_text()
    assert "✅ passed" in md and f"`{FP16}`" in md and "| spark_fp16 |" in md


@pytest.mark.slow
def test_a_tampered_artifact_file_fails_the_gate_naming_it(fp16_store, tmp_path, capsys):
    s = _copy(fp16_store, tmp_path)
    binf = s / "published" / "spark_fp16" / FP16 / "model_ctx_qnn.bin"
    data = bytearray(binf.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the context binary
    binf.write_bytes(bytes(data))
    (s / "published" / "spark_fp16" / FP32 / "model.onnx.data").unlink()
    xml = tmp_path / "gate.xml"
    assert _gate(s, "--junit", xml) == EXIT_BLOCKED
    out = capsys.readouterr().out
    assert "model_ctx_qnn.bin was modified" in out and "model.onnx.data is missing" in out
    _, _, failed = _junit(xml)
    assert set(failed) == {f"{FP16} :: files", f"{FP32} :: files"}
    assert "model_ctx_qnn.bin" in failed[f"{FP16} :: files"]


@pytest.mark.slow
def test_a_regression_beyond_the_baseline_tolerance_fails_even_above_the_threshold(fp16_store, tmp_path, capsys):
    s = _copy(fp16_store, tmp_path)
    base = tmp_path / "baseline.json"
    assert _gate(s, "--baseline", base, "--write-baseline") == EXIT_OK
    m = json.loads(_manifest_path(s, FP16).read_text())
    snr = m["parity"]["metrics"]["outputs"]["logits"]["snr_db"]

    _set_figure(s, FP16, "logits", snr - 0.5)  # inside the 1 dB tolerance
    assert _gate(s, "--baseline", base) == EXIT_OK

    _set_figure(s, FP16, "logits", snr - 1.5)  # 1.5 dB worse, still above the 45 dB bar
    assert snr - 1.5 >= 45
    _set_figure(s, FP16, "lm", 0.97, "top1_agreement")   # baseline 1.0: beyond 0.02, above the 0.95 bar
    xml = tmp_path / "gate.xml"
    assert _gate(s, "--baseline", base, "--junit", xml) == EXIT_BLOCKED
    _, _, failed = _junit(xml)
    assert set(failed) == {f"{FP16} :: logits snr_db", f"{FP16} :: lm top1_agreement"}
    assert "regressed beyond the baseline" in failed[f"{FP16} :: logits snr_db"]
    assert "although the threshold is met" in failed[f"{FP16} :: logits snr_db"]
    assert "regressed beyond the baseline" in capsys.readouterr().out

    # the same drop with a declared looser tolerance passes; below the threshold fails whatever the tolerance
    assert _gate(s, "--baseline", base, "--tolerance-db", "2", "--tolerance-agreement", "0.05") == EXIT_OK
    _set_figure(s, FP16, "logits", 44.0)
    assert _gate(s, "--baseline", base, "--tolerance-db", "10", "--tolerance-agreement", "0.05") == EXIT_BLOCKED


@pytest.mark.slow
def test_missing_artifacts_misplaced_verdicts_and_bad_baselines(fp16_store, tmp_path, capsys):
    s = _copy(fp16_store, tmp_path)
    base = tmp_path / "baseline.json"
    assert _gate(s, "--baseline", base, "--write-baseline") == EXIT_OK
    # no cache of finished steps: a rerun would rebuild, not re-execute, so it is refused
    assert _gate(s, "--rerun") == EXIT_BAD_INPUT
    assert "has no cache/" in capsys.readouterr().err
    # an artifact that stopped being built fails against the baseline
    shutil.rmtree(s / "published" / "spark_fp16" / FP32)
    assert _gate(s, "--baseline", base) == EXIT_BLOCKED
    assert "in the baseline but not in the store" in capsys.readouterr().out
    # a passing verdict on the wrong shelf is not trusted
    (s / "unverified" / "spark_fp16").mkdir(parents=True)
    shutil.move(s / "published" / "spark_fp16" / FP16, s / "unverified" / "spark_fp16" / FP16)
    assert _gate(s) == EXIT_BLOCKED
    assert "on the unverified shelf" in capsys.readouterr().out
    # bad input: a corrupt baseline, an unknown recipe, a corrupt manifest
    base.write_text("{not json")
    assert _gate(s, "--baseline", base) == EXIT_BAD_INPUT
    assert _gate(s, "--recipe", "nope") == EXIT_BAD_INPUT
    capsys.readouterr()
    (s / "unverified" / "spark_fp16" / FP16 / "manifest.json").write_text("{")
    assert _gate(s) == EXIT_BLOCKED  # a directory on a shelf without a valid manifest fails the gate, naming it
    assert f"unverified/spark_fp16/{FP16}/manifest.json is not valid JSON" in capsys.readouterr().out


@pytest.mark.slow
def test_rerun_writes_a_fresh_store_and_reports_every_moved_figure(fp16_store, tmp_path, capsys):
    s = _copy(fp16_store, tmp_path, cache=True)
    family_check = s / "cache" / "parity-end-to-end-check" / "k"  # a family's measurement (MiniCPM-o's chains)
    family_check.mkdir(parents=True)
    (family_check / "chain.npz").write_bytes(b"measured")
    before = {p.relative_to(s): p.stat().st_mtime_ns for p in s.rglob("*") if p.is_file()}
    base, res, fresh = tmp_path / "baseline.json", tmp_path / "gate.json", tmp_path / "fresh"
    assert _gate(s, "--baseline", base, "--write-baseline") == EXIT_OK
    started = time.time_ns()
    assert _gate(s, "--baseline", base, "--rerun", "--rerun-store", fresh, "--json", res, "--tolerance-db", "0.001") \
        == EXIT_OK
    # the rerun executed the same files again: the same parity steps (same bytes, same keys), each measured anew,
    # none copied from the audited store's cache
    measured = {d.name for d in (s / "cache" / "parity").iterdir()}
    assert measured and {d.name for d in (fresh / "cache" / "parity").iterdir()} == measured
    assert all((fresh / "cache" / "parity" / k / ".done").stat().st_mtime_ns >= started for k in measured)
    assert not (fresh / "cache" / family_check.parent.name).exists()  # measurements are never copied
    after = {p.relative_to(s): p.stat().st_mtime_ns for p in s.rglob("*") if p.is_file()}
    assert after == before  # the audited store was not written to
    assert (fresh / "published" / "spark_fp16" / FP16 / "manifest.json").is_file()
    r = json.loads(res.read_text())
    assert r["rerun"]["fresh_store"] == str(fresh) and r["rerun"]["recipes"] == ["spark_fp16"]
    assert r["rerun"]["moved"] == []  # the runtimes are deterministic: every figure reproduced exactly
    for a in r["artifacts"]:
        cases = {c["name"]: c for c in a["cases"]}
        assert cases["rerun"]["status"] == "pass" and "no figure moved" in cases["rerun"]["message"]
        assert all(c["value"] == c["baseline"] for c in a["cases"] if c["bound"] is not None)

    # a figure that moves is reported with its delta: the audited manifest (and its run report) claim 1 dB more
    # than the files reproduce, consistently, so only the rerun can tell
    mp = _manifest_path(s, FP16)
    m = json.loads(mp.read_text())
    snr = m["parity"]["metrics"]["outputs"]["logits"]["snr_db"]
    _set_figure(s, FP16, "logits", snr + 1.0)
    fresh2 = tmp_path / "fresh2"
    assert _gate(s, "--rerun", "--rerun-store", fresh2, "--json", res, "--tolerance-db", "0.5") == EXIT_BLOCKED
    moved = json.loads(res.read_text())["rerun"]["moved"]
    assert moved == [{"artifact": f"spark_fp16/{FP16}", "figure": "logits/snr_db", "before": snr + 1.0, "after": snr,
                      "delta": f"{-1.0:+.6g}"}]
    assert "logits/snr_db moved -1" in capsys.readouterr().out


def test_unverified_is_never_a_pass():
    reasons = ["no CoreML runtime on Linux"]
    assert _verdict_case("unverified", "unverified", reasons, "unverified", allow_unverified=False).status == "fail"
    allowed = _verdict_case("unverified", "unverified", reasons, "unverified", allow_unverified=True)
    assert allowed.status == "skipped" and "not a pass" in allowed.message
    assert _verdict_case("blocked", "blocked", ["x"], "blocked", True).status == "fail"
    # the stored status is not what is judged: a recomputed block on the published shelf fails, naming both
    moved = _verdict_case("published", "blocked", ["logits snr_db = 30, required >= 45"], "pass", False)
    assert moved.status == "fail" and "the stored verdict says 'pass'" in moved.message and "published shelf" in moved.message


def test_tolerances():
    t = Tolerances(db=1.0, agreement=0.02, ratio=2.0)
    assert t.regressed("snr_db", 46.9, 48.0) and not t.regressed("snr_db", 47.1, 48.0)
    assert t.regressed("top1_agreement", 0.97, 1.0) and not t.regressed("greedy_agreement", 0.99, 1.0)
    assert t.regressed("max_logprob_delta", 0.0041, 0.002) and not t.regressed("max_logprob_delta", 0.0039, 0.002)
    assert not t.regressed("snr_db", 60.0, 48.0)  # improvements never fail


def test_gate_bad_input_without_a_store(tmp_path):
    assert _gate(tmp_path / "nothing-here") == EXIT_BAD_INPUT
    assert _gate(tmp_path, "--write-baseline") == EXIT_BAD_INPUT  # needs --baseline
    assert _gate(tmp_path, "--baseline", tmp_path / "missing.json") == EXIT_BAD_INPUT


def test_the_documented_ci_workflow_runs_commands_that_exist():
    """docs/ci/github-actions.yml: every omni-export command line it runs parses with today's CLI."""
    import shlex
    from pathlib import Path

    import yaml

    from omni_export.commands.cli import build_parser

    wf = yaml.safe_load((Path(__file__).parents[2] / "docs" / "ci" / "github-actions.yml").read_text())
    runs = [s["run"] for s in wf["jobs"]["parity"]["steps"] if "omni-export" in s.get("run", "")]
    cmds = [shlex.split(r)[1:] for r in runs if r.startswith("omni-export ")]
    assert [c[0] for c in cmds] == ["recipe", "gate", "report"]
    for c in cmds:
        build_parser().parse_args(c)  # argparse exits 2 on an unknown option
