"""``omni-export hub submit`` through the real qai-hub client against a local stand-in of the AI Hub REST API.

One small store per module: the shipped spark_w8a16 recipe trimmed to its QDQ build (fewer calibration and
parity tokens, same thresholds), built once by the real pipeline. The client finds the stand-in only through its
own configuration: a client.ini in tmp_path named by QAIHUB_CLIENT_INI.
"""
import json
import shutil
import tempfile

import pytest
import yaml

from omni_export.commands.cli import main
from omni_export.errors import EXIT_BAD_INPUT, EXIT_BLOCKED, EXIT_HUB, EXIT_OK

from .standin import STANDIN_MARK, StandIn

TOKEN = "hubtest-token-5f1c9a7e3b2d4c6e8a0b"
ARTIFACT = "decode_step.w8a16.qdq_onnx"
STEPS = "32"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A store holding the published QDQ artifact of a trimmed spark_w8a16, and the recipe file it was built from."""
    from importlib import resources

    root = tmp_path_factory.mktemp("hub")
    d = yaml.safe_load(resources.files("omni_export.recipes").joinpath("spark_w8a16.yaml").read_text())
    for k in ("options", "presets"):  # the decode step only (the prefill's options name a component dropped here)
        d.pop(k, None)
    d.update(name="spark_w8a16_hub", builds=[{"target": "qdq_onnx", "scheme": "w8a16"}], components=["decode_step"],
             calibration={"max_samples": 48, "new_tokens": 4}, parity={"new_tokens": 8, "simulator_steps": 10})
    recipe = root / "spark_w8a16_hub.yaml"
    recipe.write_text(yaml.safe_dump(d))
    store = root / "store"
    assert main(["recipe", str(recipe), "--store", str(store)]) == EXIT_OK
    assert (store / "published" / "spark_w8a16_hub" / ARTIFACT / "manifest.json").exists()
    return recipe, store


@pytest.fixture
def store(built, tmp_path):
    """A private copy of the built store, so every test starts from the published artifact and an empty ledger."""
    dst = tmp_path / "store"
    shutil.copytree(built[1], dst)
    return dst


def _submit(recipe, store, *extra):
    return main(["hub", "submit", "--recipe", str(recipe), "--store", str(store), "--device", "galaxy_s25",
                 "--artifact", ARTIFACT, "--steps", STEPS, "--poll-seconds", "0.05", "--timeout-seconds", "120",
                 *extra])


def _manifest(store, shelf):
    return json.loads((store / shelf / "spark_w8a16_hub" / ARTIFACT / "manifest.json").read_text())


def _standin(tmp_path, monkeypatch, **kw):
    s = StandIn(TOKEN, tmp_path / "standin", **kw)
    s.__enter__()
    monkeypatch.setenv("QAIHUB_CLIENT_INI", str(s.write_client_ini(tmp_path / "client.ini")))
    return s


def test_compile_profile_inference_gate_through_the_real_client(built, store, tmp_path, monkeypatch, capsys):
    recipe = built[0]
    s = _standin(tmp_path, monkeypatch)
    scratch = tmp_path / "tmp"  # where tempfile puts things for this test: it must be empty at the end
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    try:
        assert _submit(recipe, store) == EXIT_OK
        out = capsys.readouterr()
        m = _manifest(store, "published")
        h = m["hub"]["galaxy_s25"]
        assert h["device"]["hub_name"] == "Samsung Galaxy S25 (Family)" and "framework:qnn" in h["device"]["attributes"]
        assert h["compile"]["options"] == "--target_runtime qnn_context_binary" and h["compile"]["status"] == "SUCCESS"
        assert h["compile"]["qairt_version"] == "service default"
        for kind in ("compile", "profile", "inference"):
            assert h[kind]["job_id"] in s.jobs and h[kind]["url"].endswith(f"/jobs/{h[kind]['job_id']}/")
            assert h[kind]["url"] in out.out
        # profile figures come from the service's profile (the stand-in times ORT CPU and says so)
        assert h["profile"]["hub_version"] == "standin" and h["profile"]["layers_by_compute_unit"] == {"CPU": 1}
        assert h["profile"]["latency_ms"] > 0 and h["profile"]["peak_memory_bytes"] > 0
        assert h["profile"]["inference_runs"] == 5
        # on-device parity: 32 teacher-forced steps, the real QDQ graph's outputs vs fp32, the recipe's gate
        par = h["parity"]
        assert par["steps"] == 32 and h["inference"]["samples"] == 32 and par["sequences"] == 4
        assert par["metrics"]["outputs"]["logits"]["snr_db"] >= 25
        # top-1 is scored from position 1 (position 0 is the prefill's: docs/parity.md), so 4 sequences give 32 - 4
        assert par["metrics"]["lm"]["top1_positions"] == 28
        assert par["not_measured"] == {}  # every w8a16 threshold is a per-step metric (fp32's greedy one is not)
        assert h["verdict"]["status"] == "pass" and all(c["ok"] for c in h["verdict"]["checks"])
        assert {t["metric"] for t in h["thresholds"]} == {"snr_db", "top1_agreement"}
        assert m["verdict"]["status"] == "pass" and m["verdict"]["local"]["status"] == "pass"
        assert h["parity"]["mode_key"] == "teacher-forced" and h["recipe_hash"] == m["recipe"]["hash"]
        # the gate recomputes the on-device verdict from the figures and the pinned recipe, and agrees
        assert main(["gate", "--store", str(store)]) == EXIT_OK
        assert any(c.get("where") == "ai-hub galaxy_s25" for c in m["verdict"]["checks"])
        # the files that ship are still there, unchanged
        for fn, f in m["artifact"]["files"].items():
            assert (store / "published" / "spark_w8a16_hub" / ARTIFACT / fn).stat().st_size == f["bytes"]
        # the client authenticated with the token from client.ini on every API call
        assert s.count("POST", "api/v1/jobs") == 3 and s.count("PUT", "files/model", prefix=True) == 1
        # the token is in no file the tool wrote, and was never printed
        for p in store.rglob("*"):
            if p.is_file():
                assert TOKEN.encode() not in p.read_bytes(), p
        assert TOKEN not in out.out + out.err

        # a rerun finds every job in the ledger: nothing uploaded or submitted again, same verdict
        calls = len(s.calls)
        assert _submit(recipe, store) == EXIT_OK
        assert s.count("POST", "api/v1/jobs") == 3 and s.count("POST", "api/v1/models") == 1
        assert s.count("POST", "api/v1/datasets") == 1  # the input dataset, uploaded once
        assert len(s.calls) > calls  # it did look the jobs up again
        assert _manifest(store, "published")["hub"]["galaxy_s25"]["inference"]["job_id"] == h["inference"]["job_id"]
        # nothing is left in the temp directory: not the staged upload, not the client's zip of it
        assert ", ".join(sorted(str(p.relative_to(scratch)) for p in scratch.rglob("*"))) == ""
    finally:
        s.__exit__(None, None, None)


def test_failing_on_device_parity_blocks_the_artifact(built, store, tmp_path, monkeypatch):
    s = _standin(tmp_path, monkeypatch, perturb=0.3)  # a device whose outputs carry 30 % noise: ~10 dB
    try:
        assert _submit(built[0], store) == EXIT_BLOCKED
    finally:
        s.__exit__(None, None, None)
    assert not (store / "published" / "spark_w8a16_hub" / ARTIFACT).exists()
    m = _manifest(store, "blocked")
    assert m["verdict"]["status"] == "blocked" and m["verdict"]["local"]["status"] == "pass"
    assert m["hub"]["galaxy_s25"]["verdict"]["status"] == "blocked"
    assert m["hub"]["galaxy_s25"]["parity"]["metrics"]["outputs"]["logits"]["snr_db"] < 25
    assert any(r.startswith("on-device (galaxy_s25, AI Hub): logits snr_db") for r in m["verdict"]["reasons"])


def test_missing_token_is_a_one_line_error(built, store, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("QAIHUB_CLIENT_INI", str(tmp_path / "absent.ini"))
    assert _submit(built[0], store) == EXIT_HUB
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no AI Hub API token" in err and "ai hub" in err
    empty = tmp_path / "empty.ini"
    empty.write_text("[api]\napi_token = \napi_url = http://127.0.0.1:9\nweb_url = http://127.0.0.1:9\n")
    monkeypatch.setenv("QAIHUB_CLIENT_INI", str(empty))
    assert _submit(built[0], store) == EXIT_HUB
    assert "empty api_token" in capsys.readouterr().err
    assert not (store / "hub").exists()


def test_dry_run_lists_the_jobs_and_contacts_nothing(built, store, tmp_path, monkeypatch, capsys):
    s = _standin(tmp_path, monkeypatch)
    try:
        assert _submit(built[0], store, "--dry-run", "--qairt-version", "2.31") == EXIT_OK
        assert s.calls == []
    finally:
        s.__exit__(None, None, None)
    out = capsys.readouterr().out
    for text in ("upload", "compile", "profile", "inference", "Samsung Galaxy S25 (Family)",
                 "--target_runtime qnn_context_binary --qairt_version 2.31", "up to 32 recorded steps", "new"):
        assert text in out, text
    assert not (store / "hub").exists()


def test_unknown_token_is_refused_by_the_service_as_an_ai_hub_error(built, store, tmp_path, monkeypatch, capsys):
    s = _standin(tmp_path, monkeypatch)
    try:
        s.write_client_ini(tmp_path / "client.ini", token="wrong-token-000")
        assert _submit(built[0], store) == EXIT_HUB
    finally:
        s.__exit__(None, None, None)
    err = capsys.readouterr().err
    assert "ai hub" in err and "wrong-token-000" not in err
    assert _manifest(store, "published").get("hub") is None


def test_recipe_hub_option_submits_after_the_run(built, store, tmp_path, monkeypatch, capsys):
    """`omni-export recipe R --hub DEVICE` runs the recipe (resuming from the store) and then the AI Hub jobs."""
    s = _standin(tmp_path, monkeypatch)
    try:
        assert main(["recipe", str(built[0]), "--store", str(store), "--hub", "galaxy_s25", "--hub-dry-run"]) == EXIT_OK
        assert s.calls == []
    finally:
        s.__exit__(None, None, None)
    out = capsys.readouterr().out
    assert "parity against eager fp32" in out and "dry run: nothing contacted" in out
    for text in ("upload", "compile", "profile", "inference"):
        assert text in out, text


def test_an_unknown_device_is_refused_before_any_upload(built, store, tmp_path, monkeypatch, capsys):
    s = _standin(tmp_path, monkeypatch)
    try:
        code = main(["hub", "submit", "--recipe", str(built[0]), "--store", str(store), "--device", "Pixel 99 (Family)",
                     "--artifact", ARTIFACT, "--steps", STEPS, "--poll-seconds", "0.05"])
        assert code == EXIT_HUB
        assert s.count("GET", "api/v1/devices") == 1  # the service's device list was asked for ...
        assert s.count("POST", "api/v1/models") == 0 and s.count("PUT", "files/model", prefix=True) == 0  # ... only
    finally:
        s.__exit__(None, None, None)
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "device 'Pixel 99 (Family)' is not in AI Hub's device list (2 devices, e.g. Samsung Galaxy S24 (Family)" in err
    assert "Nothing was uploaded" in err and not (store / "hub").exists()


def test_an_unreachable_service_fails_within_the_bounded_timeout(built, store, tmp_path, monkeypatch, capsys):
    import socket
    import time

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ini = tmp_path / "client.ini"
    ini.write_text(f"[api]\napi_token = {TOKEN}\napi_url = http://127.0.0.1:{port}\nweb_url = http://127.0.0.1:{port}\n")
    monkeypatch.setenv("QAIHUB_CLIENT_INI", str(ini))
    t0 = time.monotonic()
    assert _submit(built[0], store, "--connect-timeout", "2") == EXIT_HUB
    assert time.monotonic() - t0 < 20  # not the client's minutes of retries
    err = capsys.readouterr().err
    assert "listing AI Hub devices at http://127.0.0.1" in err and TOKEN not in err
    assert "no answer from AI Hub within 2 s" in err or "ConnectionError" in err


def test_results_are_judged_with_the_recipe_the_manifest_pins(built, store, tmp_path, monkeypatch, capsys):
    recipe, _ = built
    # the recipe file changed after the build (a stricter bar): its hash is no longer the artifacts' pin
    d = yaml.safe_load(recipe.read_text())
    d["thresholds"]["w8a16"][0]["min"] = 99
    edited = tmp_path / "spark_w8a16_hub.yaml"
    edited.write_text(yaml.safe_dump(d))
    s = _standin(tmp_path, monkeypatch)
    try:
        assert _submit(edited, store) == EXIT_BAD_INPUT
        assert s.calls == []
        assert "was built by recipe spark_w8a16_hub with hash" in capsys.readouterr().err
        assert _submit(recipe, store) == EXIT_OK  # the pinned one: judged with its own 25 dB bar
    finally:
        s.__exit__(None, None, None)
    m = _manifest(store, "published")
    h = m["hub"]["galaxy_s25"]
    assert [t["min"] for t in h["thresholds"] if t["metric"] == "snr_db"] == [25, 25]
    # an on-device section whose thresholds were lowered, or whose figure was raised, fails the gate naming the key
    h["thresholds"][0]["min"] = 1.0
    mp = store / "published" / "spark_w8a16_hub" / ARTIFACT / "manifest.json"
    mp.write_text(json.dumps(m))
    out = tmp_path / "gate.json"
    assert main(["gate", "--store", str(store), "--json", str(out)]) == EXIT_BLOCKED
    cases = {c["name"]: c for a in json.loads(out.read_text())["artifacts"] for c in a["cases"]}
    assert cases["ai-hub galaxy_s25"]["message"] == "hub.galaxy_s25.thresholds differ from the pinned recipe's"
