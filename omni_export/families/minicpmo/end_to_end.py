"""MiniCPM-o end to end: the same conditions through the fp32 pipeline and through each target's artifacts.

On the first parity prompt, one chain per target that executes here (every component's artifact on that target
re-opened from its shelf; a component without one on that target runs eagerly in fp32 and is named so):
- TTS head: its free-running greedy codes from the same conditions (agreement with fp32's codes, position by
  position, and the agreed prefix) and its teacher-forced top-1 on fp32's codes;
- vocoder: fp32's codes (so the audio measures the vocoder, not a flipped code) through the encoder chunks, the
  10-step CFG DiT loop and the HiFT windows, each stage on the previous artifact's output (errors compound as on the
  device), with the same noise: mu, mel and waveform SNR and log-mel distance against the exact arithmetic (fp64
  whole-utterance decode), beside the eager fp32 stream's own figures (the floor), and the HiFT artifact against
  fp32 HiFT on the same mel (its own share of the error). HiFT's phase is the running sum of its F0, and F0 follows
  the mel: a mel 60 dB from exact moves the waveform to ~10 dB SNR even through fp32 HiFT while the spectrum stays
  within ~2 dB (docs/minicpmo.md), so the waveform SNR of a chain measures phase drift, the log-mel distance what
  is heard.
The fp32 stream's and each chain's waveforms are written as .wav files next to the run's report. Artifacts are
re-opened, and the vocoder chains' figures kept, through the run's end-to-end context
(``pipeline.end_to_end.EndToEndContext``: ``runner``, ``memo``).
"""
from __future__ import annotations

import json

import numpy as np

from ...artifacts.wav import wav_writer
from ...parity.metrics import log_mel_distance, snr_db
from .. import load_prompt_set
from .graphs import eager

CHAIN = ("tts_step", "flow_encoder", "dit_step", "hift")


def _chains(results) -> dict:
    """target -> {component: result} for the artifacts executed here (one scheme per component and target; a
    component built in two schemes on one target gives one chain per scheme)."""
    by: dict = {}
    for a in results:
        comp = a.artifact_id.split(".")[0]
        if comp in CHAIN and a.runtime is not None:
            by.setdefault(a.target, {}).setdefault(comp, []).append(a)
    chains = {}
    for target, comps in by.items():
        for scheme in sorted({a.scheme for arts in comps.values() for a in arts}):
            pick = {c: next((a for a in arts if a.scheme == scheme), arts[0] if len(arts) == 1 else None)
                    for c, arts in comps.items()}
            pick = {c: a for c, a in pick.items() if a is not None}
            key = f"{target}/" + "+".join(sorted({a.scheme for a in pick.values()}))
            chains.setdefault(key, pick)
    return chains


def _codes(step, run, text, mp, nt, ref_gen):
    """Free-running greedy codes and teacher-forced top-1 on fp32's codes through ``run``."""
    prompt = step.encode(text, mp)
    _, gen = step.run_tokens(run, prompt, n_new=nt)
    out, _ = step.run_tokens(run, prompt + list(ref_gen))
    lo = len(prompt) - 1
    pred = np.argmax(out["logits"].reshape(len(prompt) + len(ref_gen), -1)[lo: lo + len(ref_gen)], axis=-1)
    same = [int(a == b) for a, b in zip(gen, ref_gen)]
    prefix = next((i for i, s in enumerate(same) if not s), len(same))
    return {"greedy_code_agreement": round(float(np.mean(same)), 4) if same else None, "greedy_codes_agreed": prefix,
            "codes": len(ref_gen), "teacher_forced_top1": round(float(np.mean(pred == np.asarray(ref_gen))), 4)}


def _vocoder(host, tokens, runs):
    """fp32 codes -> mu [80, P + T], mel [80, T] (prompt dropped), audio [T * spf], through ``runs``."""
    mus, _ = host.encode(host.chunks(tokens), runs["flow_encoder"])
    mu = np.concatenate(mus, axis=1)
    mels, _ = host.dit([c.astype(np.float32) for c in host.mu_chunks(mu)], runs["dit_step"])
    mel = np.concatenate(mels[1:], axis=1)
    audio, _ = host.hift.stream({"hift": runs["hift"]}, mel)
    return mu, mel, audio


def _vocoder_chain(ctx, host, tokens, fp32_runs, runs, arts, conditions):
    """``_vocoder`` through ``runs`` (the other stages eager fp32) and, when HiFT is among them, fp32 HiFT on that
    chain's mel: a finished step of the store (a measurement: ``gate --rerun`` executes it again), keyed by the
    sha256 of every artifact file executed (from the manifests this run wrote), its runtime, the conditions, the
    model and the code. The runtimes are deterministic, so a recipe whose vocoder builds are the same files
    (``minicpmo_fp16`` after ``minicpmo_w8a16``) reads the figures' inputs instead of driving the HTP simulator
    through the same files again."""
    files = {c: {n: f["sha256"] for n, f in json.loads((a.shelf_dir / "manifest.json").read_text())["artifact"]
                 ["files"].items()} for c, a in arts.items()}
    key = {"conditions": conditions, "files": files, "runtimes": {c: a.runtime for c, a in arts.items()}}

    def build(out):
        got = _vocoder(host, tokens, {**fp32_runs, **runs})
        alone = host.hift.stream({"hift": fp32_runs["hift"]}, got[1])[0] if "hift" in runs else np.zeros(0)
        np.savez(out / "chain.npz", mu=got[0], mel=got[1], audio=got[2], alone=alone)

    with np.load(ctx.memo("parity-end-to-end-vocoder", key, build) / "chain.npz") as z:
        return (z["mu"], z["mel"], z["audio"]), z["alone"]


def _figures(host, exact, got, sr) -> dict:
    (mu, mel, audio), (rmu, rmel, raudio) = got, exact
    P = host.P
    return {"mu_snr_db": round(snr_db(rmu[:, P:], mu[:, P:]), 2), "mel_snr_db": round(snr_db(rmel, mel), 2),
            "waveform_snr_db": round(snr_db(raudio, audio), 2),
            "log_mel_distance_db": round(log_mel_distance(raudio, audio, sr), 4)}


def end_to_end(ctx, comps: dict, results: list) -> dict | None:
    """``ctx``: the run's ``EndToEndContext`` (recipe, a runner per artifact, the store's memo)."""
    if not all(c in comps for c in CHAIN):
        return None
    r = ctx.recipe
    step = comps["tts_step"]
    host = comps["flow_encoder"].host
    sr = host.cfg.hift.sampling_rate
    text = load_prompt_set(r.prompts.parity).prompts[0]
    mp, nt = r.prompts.max_prompt_tokens, r.parity.new_tokens
    opts = {"max_prompt_tokens": mp, "new_tokens": nt}
    _, ref_gen = step.run_tokens(step.eager_runner(), step.encode(text, mp), n_new=nt)
    tokens = host.tokens(text, mp, nt)
    mel64 = host.exact_mel(text, opts)
    exact = (host.exact_mu(text, opts), mel64, host.hift.full_decode(mel64.astype(np.float32)))
    fp32_runs = {c: eager(comps[c].graph) for c in CHAIN[1:]}
    fp32 = _vocoder(host, tokens, fp32_runs)
    out = {"prompt": text, "codes": len(ref_gen), "audio_seconds": round(len(fp32[2]) / sr, 3),
           "reference": "codes: eager fp32 TTS head; mu, mel, audio: fp64 whole-utterance decode of fp32's codes",
           "fp32_stream": _figures(host, exact, fp32, sr), "chains": {}, "not_executed": []}
    wavs = {"fp32.wav": fp32[2]}
    for key, arts in _chains(results).items():
        runs = {c: ctx.runner(comps[c], a) for c, a in arts.items()}
        missing = [c for c, run in runs.items() if run is None]
        if missing:
            out["not_executed"] += [f"{c} {arts[c].target}/{arts[c].scheme}" for c in missing]
            runs = {c: run for c, run in runs.items() if run is not None}
            arts = {c: a for c, a in arts.items() if c in runs}
        if not runs:
            continue
        chain = {"builds": {c: f"{arts[c].target}/{arts[c].scheme}" if c in arts else "eager fp32" for c in CHAIN},
                 "status": {c: a.status for c, a in arts.items()}}
        if "tts_step" in runs:
            chain["codes"] = _codes(step, runs["tts_step"], text, mp, nt, ref_gen)
        voc = [c for c in CHAIN[1:] if c in runs]
        if voc:
            got, alone = _vocoder_chain(ctx, host, tokens, fp32_runs, {c: runs[c] for c in voc},
                                        {c: arts[c] for c in voc}, {"prompt": text, **opts})
            chain["audio"] = _figures(host, exact, got, sr)
            if "hift" in runs:  # the HiFT artifact alone: against fp32 HiFT on the same (chain's) mel
                chain["audio"]["hift_vs_fp32_hift_on_same_mel_snr_db"] = round(snr_db(alone, got[2]), 2)
            wavs[key.replace("/", ".").replace("+", "_") + ".wav"] = got[2]
        out["chains"][key] = chain

    out["write_files"] = wav_writer(wavs, sr)
    return out
