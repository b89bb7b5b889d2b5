"""Qwen3-TTS end to end: the same text through the fp32 pipeline and through each build's artifacts.

On the first parity prompt, for every build executed here (each component's artifact re-opened from its shelf):
- talker + code predictor builds (paired by target/scheme): teacher-forced code agreement per codebook (talker on
  the fp32 input rows -> c0; predictor on the fp32 talker states and codes -> c1..c15), the predictor over every
  frame, or on a bounded runtime over the frames its parity budget covers (``predictor_frames``; ``frames`` says how
  many each part was driven over);
- Code2Wav builds (``code2wav_first`` + ``code2wav`` of one target/scheme, e.g. fp32 for the GPU or fp16 on HTP):
  the artifacts streamed on the serving schedule (1 + 25 + 25 ...) from the fp32 codes, waveform SNR and log-mel
  distance against the fp32 full decode.
Also the fp32 exact streaming decode against the full decode, and the approximate 72-frame left-context mode
against the exact one on the codes repeated to 151 frames (the modes only differ beyond 72 frames).
The fp32 and artifact waveforms are written as 16-bit .wav files next to the run's report (the pipeline calls the
returned ``write_files`` with the report directory). Artifacts are re-opened through the run's end-to-end context
(``pipeline.end_to_end.EndToEndContext.runner``); this module reads the parity metrics, nothing else of the later
stages."""
from __future__ import annotations

import numpy as np

from ...artifacts.wav import wav_writer
from ...parity.metrics import log_mel_distance, snr_db
from .. import load_prompt_set
from .host import CHUNK, FIRST_CHUNK, PREFIX, schedule

LM_PARTS = ("talker_step", "code_predictor_step")
AUDIO_PARTS = ("code2wav_first", "code2wav")
LONG_FRAMES = 151


def _by_build(results, parts):
    """(target, scheme) -> {component: result} for builds that have every one of ``parts`` executed here."""
    groups: dict = {}
    for a in results:
        comp = a.artifact_id.split(".")[0]
        if comp in parts and a.runtime is not None:
            groups.setdefault((a.target, a.scheme), {})[comp] = a
    return {k: v for k, v in groups.items() if all(p in v for p in parts)}


def predictor_frames(frames: int, budget: int | None, calls_per_frame: int) -> int:
    """How many of the utterance's frames drive a code predictor build: all of them, or on a bounded runtime (the
    HTP simulator, 16 calls a frame) the frames its component parity's budget of graph calls covers, at least one."""
    return frames if budget is None else max(1, min(frames, budget // calls_per_frame))


def end_to_end(ctx, comps: dict, results: list) -> dict | None:
    """``ctx``: the run's ``EndToEndContext`` (recipe, a runner per artifact)."""
    if not all(p in comps for p in LM_PARTS + AUDIO_PARTS):
        return None
    r = ctx.recipe
    host = comps["code2wav"].host
    sr = host.cfg.decoder.sample_rate
    text = load_prompt_set(r.prompts.parity).prompts[0]
    u = host.generate(text, r.prompts.max_prompt_tokens, r.parity.new_tokens)
    sched = schedule(len(u.codes), FIRST_CHUNK, CHUNK)
    full_wav = host.full_decode(u.codes)
    ref_wav = host.exact_decode(u.codes)   # the artifacts are judged against exact arithmetic (fp64)
    exact, _ = host.stream({n: host.chunk_runner(n) for n in (FIRST_CHUNK, CHUNK)}, u.codes, sched)
    # The approximate mode only differs from the exact one past the 72-frame context: measure it on the utterance's
    # codes repeated to LONG_FRAMES frames (1 + 25 x 6 chunks).
    W = host.cfg.decoder.sliding_window
    long_codes = np.resize(u.codes, (LONG_FRAMES, u.codes.shape[1]))
    long_sched = schedule(LONG_FRAMES, FIRST_CHUNK, CHUNK)
    long_exact, _ = host.stream({n: host.chunk_runner(n) for n in (FIRST_CHUNK, CHUNK)}, long_codes, long_sched)
    approx = host.left_context_decode(long_codes, long_sched, context=W)
    out = {"prompt": text, "frames": int(len(u.codes)), "schedule": sched, "reference": "full decode in fp64",
           "fp32_full_vs_fp64_snr_db": round(snr_db(ref_wav, full_wav), 2),
           "fp32_streaming_exact_vs_full_snr_db": round(snr_db(full_wav, exact), 2),
           "fp32_streaming_exact_vs_full_snr_db_long": round(snr_db(host.full_decode(long_codes), long_exact), 2),
           f"fp32_left_context_{W}_vs_exact_snr_db": round(snr_db(long_exact, approx), 2),
           "long_frames": LONG_FRAMES, "codes": {}, "audio": {}}
    wavs = {"fp32.wav": ref_wav, "fp32.long.exact.wav": long_exact, f"fp32.long.left_context_{W}.wav": approx}
    for (target, scheme), arts in _by_build(results, LM_PARTS).items():
        runs = {p: ctx.runner(comps[p], arts[p]) for p in LM_PARTS}
        if any(v is None for v in runs.values()):
            continue
        tal = comps["talker_step"].replay(runs["talker_step"], u.talker_embeds)
        first = len(PREFIX) - 1   # the last prefix row predicts frame 0's c0
        c0 = np.argmax(tal["logits"].reshape(len(u.talker_embeds), -1)[first: first + len(u.codes)], axis=-1)
        agree = [float(np.mean(c0 == u.codes[:, 0]))]
        frames = predictor_frames(len(u.codes), ctx.budget(arts["code_predictor_step"]), u.codes.shape[1])
        per = np.zeros(u.codes.shape[1] - 1)
        for h, codes in zip(u.hidden[:frames], u.codes[:frames]):
            _, got = host.pred_frame(runs["code_predictor_step"], h, int(codes[0]), forced=[int(c) for c in codes[1:]])
            per += np.asarray(got) == codes[1:]
        agree += list(per / frames)
        out["codes"][f"{target}/{scheme}"] = {
            "teacher_forced_code_agreement": [round(x, 4) for x in agree],
            "frames": {"talker_step": int(len(u.codes)), "code_predictor_step": frames},
            "status": {p: arts[p].status for p in LM_PARTS}}
    for (target, scheme), arts in _by_build(results, AUDIO_PARTS).items():
        runs = {p: ctx.runner(comps[p], arts[p]) for p in AUDIO_PARTS}
        if any(v is None for v in runs.values()):
            continue
        wav, _ = host.stream({FIRST_CHUNK: runs["code2wav_first"], CHUNK: runs["code2wav"]}, u.codes, sched)
        out["audio"][f"{target}/{scheme}"] = {"waveform_snr_db": round(snr_db(ref_wav, wav), 2),
                                              "log_mel_distance_db": round(log_mel_distance(ref_wav, wav, sr), 4),
                                              "status": {p: arts[p].status for p in AUDIO_PARTS}}
        wavs[f"{target}.{scheme}.wav"] = wav

    out["write_files"] = wav_writer(wavs, sr)
    return out
