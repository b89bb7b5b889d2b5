"""The minicpmo recipes through the CLI on the tiny preset (slow): every component gated on the runtime that executes
it, the speech chain end to end through the artifacts with its .wav files, and an unfaithful DiT blocked."""
import json
import wave
from importlib import resources

import pytest
import yaml

from omni_export.commands.cli import main
from omni_export.errors import EXIT_BLOCKED, EXIT_OK

VOCODER = ("flow_encoder", "dit_step", "hift")


def _report(store, recipe):
    return json.loads((store / "runs" / recipe / "latest.json").read_text())


def _check_chain(report, key, builds):
    """The end-to-end chain ``key`` ran exactly ``builds`` and wrote its .wav next to the report; returns the chain."""
    e2e = report["end_to_end"]
    chain = e2e["chains"][key]
    assert chain["builds"] == builds and set(chain["status"].values()) == {"pass"}, chain
    assert chain["codes"]["codes"] == e2e["codes"] == 40
    return chain


def _check_wavs(store, recipe, report):
    run_dir = next(p for p in (store / "runs" / recipe).iterdir() if (p / "report.json").is_file())
    e2e = report["end_to_end"]
    seconds = {}
    for name in e2e["files"]:
        with wave.open(str(run_dir / name)) as w:
            assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 24000)
            seconds[name] = w.getnframes() / 24000
    assert set(seconds.values()) == {e2e["audio_seconds"]}, seconds
    return set(seconds)


@pytest.mark.slow
def test_minicpmo_w8a16_gates_every_component_and_writes_the_npu_speech_chain_as_wav(shared_store):
    """``omni-export recipe minicpmo_w8a16``: the TTS head in calibrated w8a16 passes its trained-weights bars on
    CPU-QDQ and the HTP simulator, the vocoder stages in fp16 on the HTP simulator pass theirs, fp32 ONNX matches
    eager, HiFT for the Adreno GPU is unverified (no GPU runtime here) and never published; end to end, the same
    conditions through the NPU chain give fp32's codes and the audio is written as .wav."""
    shared = shared_store("minicpmo_w8a16")
    assert shared.exit_code == EXIT_OK, shared.out
    report = _report(shared.path, "minicpmo_w8a16")
    status = {a["id"]: a["status"] for a in report["artifacts"]}
    npu = {"tts_step.w8a16.qnn_context.sm8750", *(f"{c}.fp16.qnn_context.sm8750" for c in VOCODER)}
    cpu = {f"{c}.fp32.onnx" for c in ("tts_step", *VOCODER)} | {"tts_step.w8a16.qdq_onnx"}
    assert status == {**{i: "pass" for i in npu | cpu}, "hift.fp32.adreno_gpu": "unverified"}
    arts = {a["id"]: a for a in report["artifacts"]}
    for aid in npu:
        assert arts[aid]["runtime"] == "qnn-htp-simulator (SM8750)"
    for aid in ("tts_step.w8a16.qdq_onnx", "tts_step.w8a16.qnn_context.sm8750"):
        lm = arts[aid]["parity"]["lm"]
        assert lm["top1_agreement"] >= 0.94 and lm["kld_mean"] <= 5e-3, lm  # the recipe's bars, re-read by the gate
        assert {c["metric"] for c in arts[aid]["checks"]} >= {"snr_db", "kld_mean", "top1_agreement"}
    assert set(report["calibration"]) == {"tts_step"}   # only the w8a16 head is calibrated
    e2e = report["end_to_end"]
    npu_chain = _check_chain(report, "qnn_context/fp16+w8a16", {
        "tts_step": "qnn_context/w8a16", **{c: "qnn_context/fp16" for c in VOCODER}})
    assert npu_chain["codes"]["teacher_forced_top1"] >= 0.94
    fp32_chain = _check_chain(report, "onnx/fp32", {c: "onnx/fp32" for c in ("tts_step", *VOCODER)})
    assert fp32_chain["codes"]["greedy_code_agreement"] == 1.0
    # fp32 artifacts end to end sit at the eager fp32 stream's floor; the NPU chain's mel is fp16-faithful; the
    # HiFT artifact alone, on the chain's own mel, keeps its component figure's class (>= its 30 dB bar)
    assert fp32_chain["audio"]["mel_snr_db"] >= 100 and e2e["fp32_stream"]["mel_snr_db"] >= 100
    assert npu_chain["audio"]["mel_snr_db"] >= 38 and npu_chain["audio"]["hift_vs_fp32_hift_on_same_mel_snr_db"] >= 30
    assert npu_chain["audio"]["log_mel_distance_db"] < 6.0
    assert "adreno_gpu/fp32" in e2e["chains"] and e2e["chains"]["adreno_gpu/fp32"]["status"] == {"hift": "unverified"}
    wavs = _check_wavs(shared.path, "minicpmo_w8a16", report)
    assert {"fp32.wav", "onnx.fp32.wav", "qnn_context.fp16_w8a16.wav"} <= wavs
    shelves = {p.parent.name for p in (shared.path / "published").glob("minicpmo_w8a16/*/manifest.json")}
    assert shelves == npu | cpu


@pytest.mark.slow
def test_minicpmo_fp16_passes_on_the_npu_end_to_end(shared_store):
    """``omni-export recipe minicpmo_fp16`` (from the w8a16 store's step cache: the vocoder builds are the same
    files): every fp16 context binary passes on the HTP simulator and the all-fp16 NPU chain writes its .wav."""
    shared = shared_store("minicpmo_fp16", seed=shared_store("minicpmo_w8a16"))
    assert shared.exit_code == EXIT_OK, shared.out
    report = _report(shared.path, "minicpmo_fp16")
    status = {a["id"]: a["status"] for a in report["artifacts"]}
    assert {i for i, s in status.items() if s == "pass"} == {
        *(f"{c}.fp32.onnx" for c in ("tts_step", *VOCODER)), *(f"{c}.fp16.qnn_context.sm8750" for c in ("tts_step", *VOCODER))}
    chain = _check_chain(report, "qnn_context/fp16", {c: "qnn_context/fp16" for c in ("tts_step", *VOCODER)})
    assert chain["codes"]["teacher_forced_top1"] >= 0.95
    # the vocoder builds are the w8a16 recipe's files: its chain through them was a finished step of the store
    # (keyed by their sha256), read here instead of run again on the simulator, and gives the same audio figures
    w8a16 = _report(shared_store("minicpmo_w8a16").path, "minicpmo_w8a16")["end_to_end"]["chains"]
    assert chain["audio"] == w8a16["qnn_context/fp16+w8a16"]["audio"]
    # the w8a16 run made one such step per chain with vocoder artifacts (fp32 ONNX, the Adreno build on its CPU
    # stand-in, NPU); this run added none
    assert len(list((shared.path / "cache" / "parity-end-to-end-vocoder").iterdir())) == 3
    assert "qnn_context.fp16.wav" in _check_wavs(shared.path, "minicpmo_fp16", report)


@pytest.mark.slow
def test_dit_with_int8_activations_is_blocked_at_the_shipped_dit_bar(tmp_path):
    """The DiT estimator step as QDQ with int8 activations (w8a8), held to the shipped fp16 DiT's bar: blocked, with
    the reason in its manifest and exit 1 (its weakest output measured 20.4 dB, the conv cache; the bar is 38)."""
    shipped = yaml.safe_load(resources.files("omni_export.recipes").joinpath("minicpmo_w8a16.yaml").read_text())
    recipe = {**{k: shipped[k] for k in ("model", "context", "device", "prompts", "calibration", "parity")},
              "name": "minicpmo_dit_w8a8", "description": "the DiT step with int8 activations",
              "components": ["dit_step"], "builds": [{"target": "qdq_onnx", "scheme": "w8a8"}],
              "thresholds": {"dit_step/w8a8": shipped["thresholds"]["dit_step/fp16"]}}
    path = tmp_path / "minicpmo_dit_w8a8.yaml"
    path.write_text(yaml.safe_dump(recipe))
    store = tmp_path / "store"
    assert main(["recipe", str(path), "--store", str(store)]) == EXIT_BLOCKED
    m = json.loads((store / "blocked" / "minicpmo_dit_w8a8" / "dit_step.w8a8.qdq_onnx" / "manifest.json").read_text())
    assert m["verdict"]["status"] == "blocked" and m["verdict"]["reasons"]
    weakest = min(o["snr_db"] for o in m["parity"]["metrics"]["outputs"].values())
    assert weakest < 38 - 10, weakest   # far below the bar, not a near miss
    assert not (store / "published" / "minicpmo_dit_w8a8").exists()
