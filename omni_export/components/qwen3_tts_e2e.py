"""Qwen3-TTS end to end: the same text through the fp32 pipeline and through each build's artifacts.

For every (target, scheme) whose talker, code predictor and both Code2Wav artifacts were executed here, on the
first parity prompt: teacher-forced code agreement per codebook (talker on the fp32 input rows -> c0; predictor on
the fp32 talker states and codes -> c1..c15), then the artifact Code2Wav streamed on the serving schedule
(1 + 25 + 25 ...) from the fp32 codes: waveform SNR and log-mel distance against the fp32 full decode. Also the
approximate 72-frame left-context streaming mode against the exact decode (fp32), and the fp32 and artifact
waveforms as 16-bit .wav files under ``runs/<recipe>/audio/`` (next to the run reports) to listen to."""
from __future__ import annotations

import json
import wave
from pathlib import Path

import numpy as np

from ..artifacts.store import atomic_dir
from ..exporters import Built, get_target
from ..parity.metrics import log_mel_distance, snr_db
from .qwen3_tts_host import CHUNK, FIRST_CHUNK, schedule

PARTS = ("talker_step", "code_predictor_step", "code2wav_first", "code2wav")


def write_wav(path: Path, audio: np.ndarray, sr: int) -> None:
    pcm = (np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sr)
        w.writeframes(pcm.tobytes())


def _runner(pipe, comp, result):
    """Re-open a shelved artifact with its target's runtime (None if no runtime here can execute it)."""
    m = json.loads((result.shelf_dir / "manifest.json").read_text())
    files = {meta["role"]: fn for fn, meta in m["artifact"]["files"].items()}
    target = get_target(result.target)
    deps = []
    for dt, ds in target.dependencies(result.scheme):
        dep = next((a for a in pipe_results(pipe) if a.target == dt and a.scheme == ds
                    and a.artifact_id.startswith(comp.name + ".")), None)
        if dep is not None:
            dm = json.loads((dep.shelf_dir / "manifest.json").read_text())
            deps.append(Built(dt, ds, dep.shelf_dir, {v["role"]: k for k, v in dm["artifact"]["files"].items()}))
    built = Built(result.target, result.scheme, result.shelf_dir, files, m["artifact"]["export"], deps)
    try:
        ex = target.execution(built, comp, pipe.device if hasattr(pipe, "device") else _device(pipe))
    except IndexError:  # a companion needs a dependency that this run did not shelve
        return None
    return ex.run


def pipe_results(pipe):
    return pipe.__dict__.get("_e2e_results", [])


def _device(pipe):
    from ..devices import get_device
    return get_device(pipe.recipe.device)


def end_to_end(pipe, comps: dict, results: list) -> dict | None:
    if not all(p in comps for p in PARTS):
        return None
    pipe._e2e_results = results
    from ..calibration.prompts import load_prompt_set
    r = pipe.recipe
    host = comps["code2wav"].host
    sr = host.cfg.decoder.sample_rate
    text = load_prompt_set(r.prompts.parity).prompts[0]
    u = host.generate(text, r.prompts.max_prompt_tokens, r.parity.new_tokens)
    sched = schedule(len(u.codes), FIRST_CHUNK, CHUNK)
    ref_wav = host.full_decode(u.codes)
    exact, _ = host.stream({n: host.chunk_runner(n) for n in (FIRST_CHUNK, CHUNK)}, u.codes, sched)
    approx = host.left_context_decode(u.codes, sched, context=host.cfg.decoder.sliding_window)
    out = {"prompt": text, "frames": int(len(u.codes)), "schedule": sched,
           "fp32_streaming_vs_full_snr_db": round(snr_db(ref_wav, exact), 2),
           "fp32_left_context_72_vs_exact_snr_db": round(snr_db(exact, approx), 2), "builds": {}}
    wavs = {"fp32.wav": ref_wav}
    groups: dict = {}
    for a in results:
        comp_name = a.artifact_id.split(".")[0]
        groups.setdefault((a.target, a.scheme), {})[comp_name] = a
    for (target, scheme), arts in groups.items():
        if not all(p in arts for p in PARTS) or any(arts[p].runtime is None for p in PARTS):
            continue
        runs = {p: _runner(pipe, comps[p], arts[p]) for p in PARTS}
        if any(v is None for v in runs.values()):
            continue
        tal = comps["talker_step"].replay(runs["talker_step"], u.talker_embeds)
        c0 = np.argmax(tal["logits"].reshape(len(u.talker_embeds), -1)[2:], axis=-1)
        agree = [float(np.mean(c0 == u.codes[:, 0]))]
        per = np.zeros(15)
        for h, codes in zip(u.hidden, u.codes):
            _, got = host.pred_frame(runs["code_predictor_step"], h, int(codes[0]), forced=[int(c) for c in codes[1:]])
            per += np.asarray(got) == codes[1:]
        agree += list(per / len(u.codes))
        wav, _ = host.stream({FIRST_CHUNK: runs["code2wav_first"], CHUNK: runs["code2wav"]}, u.codes, sched)
        key = f"{target}/{scheme}"
        out["builds"][key] = {"teacher_forced_code_agreement": [round(x, 4) for x in agree],
                              "waveform_snr_db": round(snr_db(ref_wav, wav), 2),
                              "log_mel_distance_db": round(log_mel_distance(ref_wav, wav, sr), 4)}
        wavs[f"{target}.{scheme}.wav"] = wav
    d = pipe.store.root / "runs" / r.name / "audio"
    with atomic_dir(d) as tmp:
        for name, w in wavs.items():
            write_wav(tmp / name, w, sr)
    out["wav_files"] = sorted(str((d / n).relative_to(pipe.store.root)) for n in wavs)
    return out
