"""Forgeries a consistent forger can make (issue 45): every place the store records a fact is edited to agree, so only
what lies outside the store (the recipes CI trusts) or executing the files again can tell. And inputs that must be
one FAIL line or one refusal, never a crash, a hang or a replaced file.

Each test works on its own copy of a session store (``tests/shared_stores.py``); the figures asserted are read from
the store itself."""
import json
import os
import shutil
import subprocess
import sys
from importlib import resources

import pytest
import yaml

from omni_export.artifacts.hashing import hash_file, path_bytes
from omni_export.commands.cli import main
from omni_export.errors import EXIT_BAD_INPUT, EXIT_BLOCKED, EXIT_OK, RecipeError
from omni_export.parity.gate import Threshold
from omni_export.recipes import parse_recipe

FP16 = "decode_step.fp16.qnn_context.sm8750"
FP32 = "decode_step.fp32.onnx"
QDQ = "decode_step.w8a16.qdq_onnx"

pytestmark = pytest.mark.slow


def _copy(src, tmp_path, name="store"):
    dst = tmp_path / name
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("cache"), symlinks=True)
    return dst


def _mpath(store, recipe, artifact, shelf="published"):
    return store / shelf / recipe / artifact / "manifest.json"


def _edit_everywhere(store, recipe, artifact, fn):
    """``fn(record)`` on the artifact's manifest and on its entry in every run report of the recipe."""
    mp = _mpath(store, recipe, artifact)
    m = json.loads(mp.read_text())
    fn(m, "manifest")
    mp.write_text(json.dumps(m))
    for rp in (store / "runs" / recipe).glob("*/report.json"):
        rep = json.loads(rp.read_text())
        for a in rep["artifacts"]:
            if a["id"] == artifact:
                fn(a, "report")
        rp.write_text(json.dumps(rep))


def _gate(store, tmp_path, *extra):
    """(exit code, {artifact :: case: message} of the failures, the gate's JSON)."""
    out = tmp_path / "gate.json"
    code = main(["gate", "--store", str(store), "--json", str(out), *map(str, extra)])
    res = json.loads(out.read_text())
    return code, {f"{a['id']} :: {c['name']}": c["message"] for a in res["artifacts"] for c in a["cases"]
                  if c["status"] == "fail"}, res


def _fail_lines(capsys) -> list[str]:
    return [ln.strip() for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("FAIL ")]


# -- consistent forgeries ------------------------------------------------------------------------------------------
def test_every_figure_set_to_infinity_everywhere_fails(fp16_store, tmp_path, capsys):
    s = _copy(fp16_store, tmp_path)

    def inf(rec, where):
        metrics = rec["parity"]["metrics"] if where == "manifest" else rec["parity"]
        for fig in metrics["outputs"].values():
            for k in fig:
                fig[k] = float("inf")
        for k in ("top1_agreement", "kld_mean", "max_logprob_delta"):
            metrics["lm"][k] = float("inf")
        checks = rec["verdict"]["checks"] if where == "manifest" else rec["checks"]
        for c in checks:
            c["value"] = float("inf")
    _edit_everywhere(s, "spark_fp16", FP16, inf)
    assert "Infinity" in _mpath(s, "spark_fp16", FP16).read_text()
    code, failed, _ = _gate(s, tmp_path)
    assert code == EXIT_BLOCKED and set(failed) == {f"{FP16} :: manifest"}
    assert "parity.metrics.outputs.logits.snr_db is inf, not a finite number" in failed[f"{FP16} :: manifest"]
    assert len(_fail_lines(capsys)) == 1


def test_negative_step_counts_without_a_baseline_fail(fp16_store, tmp_path):
    s = _copy(fp16_store, tmp_path)

    def negative(rec, where):
        (rec["parity"]["metrics"] if where == "manifest" else rec["parity"])["steps"] = -20
        if where == "manifest":
            rec["parity"]["asked_steps"] = -20
    _edit_everywhere(s, "spark_fp16", FP16, negative)
    code, failed, _ = _gate(s, tmp_path)
    assert code == EXIT_BLOCKED and set(failed) == {f"{FP16} :: manifest"}
    assert "-20" in failed[f"{FP16} :: manifest"] and "not a count" in failed[f"{FP16} :: manifest"]


def _mint_recipe(store, recipe, data) -> str:
    """A recipe written into the store's recipes/ as the pipeline keeps them; returns its hash."""
    r = parse_recipe(data, "minted")
    (store / "recipes" / f"{r.hash}.json").write_text(json.dumps(r.to_dict()))
    return r.hash


@pytest.fixture(scope="module")
def w8a8_store(shared_store):
    s = shared_store("spark_w8a8")
    assert s.exit_code == EXIT_BLOCKED, s.out
    return s.path


def test_a_blocked_w8a8_artifact_published_under_a_minted_recipe_fails(w8a8_store, tmp_path, capsys):
    """The blocked artifact moved to published/, a recipe copy minted in recipes/ (every bar lowered,
    expect_blocked false), manifest and run report re-pinned to it: consistent inside the store. The shipped
    spark_w8a8 (what CI trusts by default) is not that recipe."""
    s = _copy(w8a8_store, tmp_path)
    aid = sorted(p.name for p in (s / "blocked" / "spark_w8a8").iterdir())[0]
    m = json.loads(_mpath(s, "spark_w8a8", aid, "blocked").read_text())
    assert m["verdict"]["status"] == "blocked"
    (s / "published" / "spark_w8a8").mkdir(parents=True, exist_ok=True)
    shutil.move(s / "blocked" / "spark_w8a8" / aid, s / "published" / "spark_w8a8" / aid)
    rep_path = sorted((s / "runs" / "spark_w8a8").glob("*/report.json"))[-1]
    rep = json.loads(rep_path.read_text())
    data = rep["recipe"]
    assert data["expect_blocked"] is True
    for ths in data["thresholds"].values():
        for t in ths:
            t.update({"min": -1e6} if "min" in t else {"max": 1e6})
    data["expect_blocked"] = False
    pin = _mint_recipe(s, "spark_w8a8", data)
    minted = parse_recipe(data, "minted")
    m["recipe"].update(hash=pin, file=f"recipes/{pin}.json")
    m["recipe_hash"] = pin
    m["thresholds"] = [t.to_dict() for t in minted.thresholds_for(m["artifact"]["component"]["name"],
                                                                  m["scheme"]["name"])]
    m["verdict"] = {"status": "pass", "reasons": [],
                    "checks": [{**c, "ok": True, "status": "pass"} for c in m["verdict"]["checks"]]}
    _mpath(s, "spark_w8a8", aid).write_text(json.dumps(m))
    rep["recipe"], rep["recipe_hash"], rep["exit_code"] = data, pin, 0
    for a in rep["artifacts"]:
        if a["id"] == aid:
            a["status"], a["reasons"], a["location"] = "pass", [], f"published/spark_w8a8/{aid}"
    forged_run = rep_path.parent.parent / "20990101T000000Z"
    forged_run.mkdir()
    (forged_run / "report.json").write_text(json.dumps(rep))

    code, failed, _ = _gate(s, tmp_path, "--recipe", "spark_w8a8")
    assert code == EXIT_BLOCKED
    msg = failed[f"{aid} :: recipe"]
    assert msg.startswith(f"the pinned recipe {pin[:12]}… is not the shipped recipe spark_w8a8")
    assert "expect_blocked" in msg and "thresholds" in msg
    # judged by the trusted recipe, the artifact is blocked again, on the wrong shelf
    assert "recomputed verdict 'blocked'" in failed[f"{aid} :: verdict"]
    # the same with the baseline CI keeps, and with the trusted recipe named explicitly
    assert _gate(s, tmp_path, "--recipe", "spark_w8a8", "--trust", "shipped")[0] == EXIT_BLOCKED


def _swap(a: dict, b: dict, key):
    a[key], b[key] = b[key], a[key]


@pytest.fixture
def w8a16_cpu_store(shared_store, tmp_path):
    """spark_w8a16's store with only its ONNX Runtime CPU artifacts (fp32 and QDQ) left: they re-execute in seconds,
    the HTP simulator's would take a minute."""
    src = shared_store("spark_w8a16")
    assert src.exit_code == EXIT_OK, src.out
    s = _copy(src.path, tmp_path, "w8a16")
    for d in (s / "published" / "spark_w8a16").iterdir():
        if not d.name.endswith((".fp32.onnx", ".w8a16.qdq_onnx")):
            shutil.rmtree(d)
    return s


def test_two_artifacts_files_swapped_with_their_hashes_fail_on_reexecution(w8a16_cpu_store, tmp_path, capsys):
    s, pub = w8a16_cpu_store, w8a16_cpu_store / "published" / "spark_w8a16"
    assert _gate(s, tmp_path, "--reexecute")[0] == EXIT_OK  # the intact store re-executes to the same figures
    for fn in ("model.onnx", "model.onnx.data"):
        os.replace(pub / FP32 / fn, tmp_path / fn)
        os.replace(pub / QDQ / fn, pub / FP32 / fn)
        os.replace(tmp_path / fn, pub / QDQ / fn)
    ma, mb = (json.loads(_mpath(s, "spark_w8a16", x).read_text()) for x in (FP32, QDQ))
    _swap(ma["artifact"], mb["artifact"], "files")
    for x, m in ((FP32, ma), (QDQ, mb)):
        _mpath(s, "spark_w8a16", x).write_text(json.dumps(m))
    for rp in (s / "runs" / "spark_w8a16").glob("*/report.json"):
        rep = json.loads(rp.read_text())
        ra, rb = (next(a for a in rep["artifacts"] if a["id"] == x) for x in (FP32, QDQ))
        _swap(ra, rb, "files")
        rp.write_text(json.dumps(rep))
    code, failed, _ = _gate(s, tmp_path)
    assert (code, failed) == (EXIT_OK, {})  # consistent: nothing static tells
    code, failed, res = _gate(s, tmp_path, "--reexecute")
    assert code == EXIT_BLOCKED and set(failed) == {f"{FP32} :: reexecute", f"{QDQ} :: reexecute"}
    assert "differ from the manifest's" in failed[f"{FP32} :: reexecute"]
    msg = failed[f"{FP32} :: reexecute"]  # the gated figures are named first
    assert msg.split(": ", 1)[1].split(" ")[0].rsplit(".", 1)[1] in ("greedy_agreement", "top1_agreement", "kld_max",
                                                                     "snr_db", "max_logprob_delta", "kld_mean")
    assert res["reexecute"]["artifacts"] == 4


def test_a_published_onnx_replaced_with_rewritten_hashes_fails_on_reexecution(fp16_store, tmp_path):
    """Another valid ONNX of the same graph (one weight scaled by 1.05) with the manifest's and the run report's
    sha256 and bytes rewritten to it."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    s = _copy(fp16_store, tmp_path)
    d = s / "published" / "spark_fp16" / FP32
    model = onnx.load(str(d / "model.onnx"))
    init = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * np.float32(1.05), init.name))
    for fn in ("model.onnx", "model.onnx.data"):
        (d / fn).unlink()
    onnx.save_model(model, str(d / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=1024)

    def rehash(rec, where):
        if where == "manifest":
            for fn, meta in rec["artifact"]["files"].items():
                meta.update(sha256=hash_file(d / fn), bytes=path_bytes(d / fn))
        else:
            rec["files"] = {fn: hash_file(d / fn) for fn in rec["files"]}
    _edit_everywhere(s, "spark_fp16", FP32, rehash)
    assert _gate(s, tmp_path)[:2] == (EXIT_OK, {})  # consistent: nothing static tells
    code, failed, _ = _gate(s, tmp_path, "--reexecute")
    assert code == EXIT_BLOCKED and set(failed) == {f"{FP32} :: reexecute"}
    assert "figure(s) differ from the manifest's" in failed[f"{FP32} :: reexecute"]


def test_the_run_report_binds_the_file_hashes(fp16_store, tmp_path):
    s = _copy(fp16_store, tmp_path)
    m = json.loads(_mpath(s, "spark_fp16", FP32).read_text())
    rp = sorted((s / "runs" / "spark_fp16").glob("*/report.json"))[-1]
    rep = json.loads(rp.read_text())
    entry = next(a for a in rep["artifacts"] if a["id"] == FP32)
    assert entry["files"] == {fn: meta["sha256"] for fn, meta in m["artifact"]["files"].items()}
    entry["files"]["model.onnx"] = "0" * 64
    rp.write_text(json.dumps(rep))
    code, failed, _ = _gate(s, tmp_path)
    assert code == EXIT_BLOCKED and set(failed) == {f"{FP32} :: figures"}
    assert "artifact.files' sha256 differ from the file hashes" in failed[f"{FP32} :: figures"]


# -- only regular files on the shelf --------------------------------------------------------------------------------
def test_a_symlinked_file_fails(fp16_store, tmp_path):
    s = _copy(fp16_store, tmp_path)
    f = s / "published" / "spark_fp16" / FP32 / "model.onnx.data"
    outside = tmp_path / "outside.data"
    shutil.copy(f, outside)  # the same bytes: only the kind of file differs
    f.unlink()
    f.symlink_to(outside)
    code, failed, _ = _gate(s, tmp_path)
    assert code == EXIT_BLOCKED and set(failed) == {f"{FP32} :: files"}
    assert failed[f"{FP32} :: files"] == "model.onnx.data is a symlink, not a regular file (only regular files ship)"


def test_a_symlinked_artifact_directory_fails(fp16_store, tmp_path):
    s = _copy(fp16_store, tmp_path)
    d = s / "published" / "spark_fp16" / FP32
    shutil.move(d, tmp_path / "elsewhere")
    d.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    code, failed, _ = _gate(s, tmp_path)
    assert code == EXIT_BLOCKED and set(failed) == {f"{FP32} :: manifest"}
    assert failed[f"{FP32} :: manifest"].startswith(f"published/spark_fp16/{FP32} is a symlink, not a directory")


def test_a_shelf_file_linked_to_dev_zero_or_a_fifo_never_hangs(fp16_store, tmp_path):
    s = _copy(fp16_store, tmp_path)
    d = s / "published" / "spark_fp16"
    (d / FP32 / "model.onnx.data").unlink()
    (d / FP32 / "model.onnx.data").symlink_to("/dev/zero")
    (d / FP16 / "model_ctx_qnn.bin").unlink()
    os.mkfifo(d / FP16 / "model_ctx_qnn.bin")
    out = tmp_path / "gate.json"
    proc = subprocess.run([sys.executable, "-c", "import sys; from omni_export.commands.cli import main; "
                           "sys.exit(main(sys.argv[1:]))", "gate", "--store", str(s), "--json", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == EXIT_BLOCKED, proc.stderr
    res = json.loads(out.read_text())
    failed = {f"{a['id']} :: {c['name']}": c["message"] for a in res["artifacts"] for c in a["cases"]
              if c["status"] == "fail"}
    assert failed[f"{FP32} :: files"] == "model.onnx.data is a symlink, not a regular file (only regular files ship)"
    assert failed[f"{FP16} :: files"] == "model_ctx_qnn.bin is a FIFO, not a regular file (only regular files ship)"


# -- a malformed manifest is one FAIL line -------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["string figure", "component outputs", "deep nesting", "invalid json"])
def test_a_malformed_manifest_is_one_fail_line(fp16_store, tmp_path, capsys, how):
    s = _copy(fp16_store, tmp_path)
    mp = _mpath(s, "spark_fp16", FP16)
    m = json.loads(mp.read_text())
    if how == "string figure":
        m["parity"]["metrics"]["outputs"]["logits"]["snr_db"] = "48.2"
        expect = "parity.metrics.outputs.logits.snr_db is str '48.2', not a number"
    elif how == "component outputs":
        m["artifact"]["component"]["outputs"] = [[], 7]
        expect = "artifact.component.outputs is not a list of [name, shape] entries"
    if how == "deep nesting":
        mp.write_text("[" * 200_000 + "]" * 200_000)
        expect = "is not valid JSON: is nested too deeply to parse"
    elif how == "invalid json":
        mp.write_text('{"artifact": ')
        expect = "is not valid JSON"
    else:
        mp.write_text(json.dumps(m))
    code, failed, _ = _gate(s, tmp_path)
    assert code == EXIT_BLOCKED and set(failed) == {f"{FP16} :: manifest"}
    assert expect in failed[f"{FP16} :: manifest"]
    assert len(_fail_lines(capsys)) == 1


# -- trusted recipes ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def few_positions(shared_store, fp16_store):
    """spark_fp16 renamed, its fp16 top-1 bar enforced only on >= 256 positions (the store measures 6): a check
    recorded, not enforced. Built from the spark_fp16 store's step cache."""
    d = yaml.safe_load(resources.files("omni_export.recipes").joinpath("spark_fp16.yaml").read_text())
    d["name"] = "spark_fp16_few_positions"
    d["parity"]["simulator_steps"] = 20
    for t in d["thresholds"]["fp16"]:
        if t["metric"] == "top1_agreement":
            t["min_positions"] = 256
    s = shared_store(d, seed=shared_store("spark_fp16", "--simulator-steps", "20"))
    assert s.exit_code == EXIT_OK, s.out
    return s


def test_a_check_not_enforced_is_skipped_everywhere_never_passed(few_positions, tmp_path):
    s = _copy(few_positions.path, tmp_path)
    name = "spark_fp16_few_positions"
    m = json.loads(_mpath(s, name, FP16).read_text())
    top1 = next(c for c in m["verdict"]["checks"] if c["metric"] == "top1_agreement")
    assert top1["status"] == "skipped" and top1["ok"] is None and "6 positions < 256" in top1["skipped"]
    run = sorted((s / "runs" / name).glob("*/report.json"))[-1]
    entry = next(a for a in json.loads(run.read_text())["artifacts"] if a["id"] == FP16)
    assert next(c for c in entry["checks"] if c["metric"] == "top1_agreement")["ok"] is None
    md = (run.parent / "report.md").read_text()
    assert "(1 check skipped, not enforced)" in md and "Checks recorded but not enforced" in md
    assert "lm top1_agreement" in md.split("Checks recorded but not enforced")[1]

    out = {k: tmp_path / f"gate.{k}" for k in ("json", "xml", "md")}
    code = main(["gate", "--store", str(s), "--trust", few_positions.recipe, "--json", str(out["json"]),
                 "--junit", str(out["xml"]), "--markdown", str(out["md"])])
    assert code == EXIT_OK
    res = json.loads(out["json"].read_text())
    art = next(a for a in res["artifacts"] if a["id"] == FP16)
    case = next(c for c in art["cases"] if c["name"] == "lm top1_agreement")
    assert case["status"] == "skipped" and case["message"].startswith("not enforced: 6 positions < 256")
    assert art["outcome"] == "skipped" and res["counts"]["skipped"] == 1
    import xml.etree.ElementTree as ET
    tc = next(c for c in ET.parse(out["xml"]).getroot().iter("testcase")
              if c.get("name") == f"{FP16} :: lm top1_agreement")
    assert tc.find("skipped") is not None and tc.find("failure") is None
    assert "### Skipped (not passes)" in out["md"].read_text()

    assert main(["report", "--store", str(s), "--recipe", name, "--out", str(tmp_path / "html")]) == EXIT_OK
    html = (tmp_path / "html" / "report.html").read_text()
    assert "Checks recorded but not enforced" in html and "6 positions &lt; 256" in html


def test_recipes_not_covered_by_trust(few_positions, fp16_store, tmp_path):
    s = _copy(few_positions.path, tmp_path)
    # default: a recipe that is not shipped is judged by its store copy and the gate says so (skipped, not passed)
    code, failed, res = _gate(s, tmp_path)
    assert code == EXIT_OK and not failed
    trust = next(c for a in res["artifacts"] for c in a["cases"] if c["name"] == "trust")
    assert trust["status"] == "skipped" and "not a shipped recipe" in trust["message"]
    # CI names what it trusts: a recipe not covered fails
    code, failed, _ = _gate(s, tmp_path, "--trust", "shipped")
    assert code == EXIT_BLOCKED
    assert failed[f"{FP16} :: recipe"].endswith("is not one CI trusts (not covered by --trust): name its recipe "
                                                "file with --trust PATH")
    # a trusted file of the same name that differs (a bar raised) fails the store's own copy
    d = yaml.safe_load(open(few_positions.recipe))
    d["thresholds"]["fp16"][0]["min"] = 46
    other = tmp_path / "trusted.yaml"
    other.write_text(yaml.safe_dump(d))
    code, failed, _ = _gate(s, tmp_path, "--trust", other)
    assert code == EXIT_BLOCKED and "differs in thresholds.fp16" in failed[f"{FP16} :: recipe"]
    # two different trusted recipes under one name are refused
    assert main(["gate", "--store", str(s), "--trust", str(other), "--trust", few_positions.recipe]) == EXIT_BAD_INPUT


# -- refusals: outputs, tolerances, baselines, thresholds ----------------------------------------------------------
def test_outputs_are_written_only_over_regular_files(fp16_store, tmp_path, capsys):
    s = _copy(fp16_store, tmp_path)
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    link = tmp_path / "gate.json"
    link.symlink_to(target)
    fifo = tmp_path / "gate.xml"
    os.mkfifo(fifo)
    assert main(["gate", "--store", str(s), "--json", str(link)]) == EXIT_BAD_INPUT
    assert main(["gate", "--store", str(s), "--junit", str(fifo)]) == EXIT_BAD_INPUT
    assert main(["gate", "--store", str(s), "--markdown", str(tmp_path)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert f"--json {link} is a symlink, not a regular file: refused" in err
    assert f"--junit {fifo} is a FIFO, not a regular file: refused" in err
    assert target.read_text() == "keep me" and link.is_symlink() and fifo.is_fifo()
    html_link = tmp_path / "html"
    html_link.symlink_to(tmp_path / "somewhere", target_is_directory=True)
    assert main(["report", "--store", str(s), "--out", str(html_link)]) == EXIT_BAD_INPUT
    assert html_link.is_symlink() and not (tmp_path / "somewhere").exists()
    assert main(["gate", "--store", str(s), "--json", str(tmp_path / "regular.json")]) == EXIT_OK


def test_non_finite_tolerances_and_malformed_baselines_are_refused(fp16_store, tmp_path):
    s = _copy(fp16_store, tmp_path)
    for flag in ("--tolerance-db", "--tolerance-agreement", "--tolerance-ratio"):
        for v in ("nan", "inf", "-1"):
            assert main(["gate", "--store", str(s), flag, v]) == EXIT_BAD_INPUT, (flag, v)
    base = tmp_path / "baseline.json"
    assert main(["gate", "--store", str(s), "--baseline", str(base), "--write-baseline"]) == EXIT_OK
    good = json.loads(base.read_text())
    key = f"spark_fp16/{FP16}"

    def with_entry(**change):
        b = json.loads(json.dumps(good))
        b["artifacts"][key].update(change)
        base.write_text(json.dumps(b).replace('"@NaN"', "NaN"))
        return main(["gate", "--store", str(s), "--baseline", str(base)])
    figs = good["artifacts"][key]["figures"]
    assert with_entry(figures={**figs, "logits/snr_db": "@NaN"}) == EXIT_BAD_INPUT
    assert with_entry(figures={**figs, "logits/snr_db": "48"}) == EXIT_BAD_INPUT
    assert with_entry(figures={}) == EXIT_BAD_INPUT
    assert with_entry(figures=[1, 2]) == EXIT_BAD_INPUT
    assert with_entry(steps="20") == EXIT_BAD_INPUT
    assert with_entry(steps=-1) == EXIT_BAD_INPUT
    # a figure left out of an entry is not a check dropped: it fails, asking for the baseline to be rewritten
    code, failed, _ = _gate(s, tmp_path, "--baseline", base) if with_entry(
        figures={k: v for k, v in figs.items() if k != "logits/snr_db"}) is not None else (None, None, None)
    assert code == EXIT_BLOCKED and set(failed) == {f"{FP16} :: logits snr_db"}
    assert "the baseline entry has no figure logits/snr_db" in failed[f"{FP16} :: logits snr_db"]


@pytest.mark.parametrize("bound", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_thresholds_are_refused(bound):
    for kw in ({"min": bound}, {"max": bound}):
        with pytest.raises(RecipeError, match="is not a finite number"):
            Threshold("snr_db", "*", reason="r", **kw)
    # in a recipe: one line naming the threshold (a NaN bar would block everything, -inf would pass everything)
    d = yaml.safe_load(resources.files("omni_export.recipes").joinpath("spark_fp16.yaml").read_text())
    d["thresholds"]["fp16"][0]["min"] = bound
    with pytest.raises(RecipeError, match=r"thresholds.fp16\[0\]: threshold snr_db on '\*': min .* is not a finite"):
        parse_recipe(d, "recipe")
