"""Per-frame latency of Qwen3-TTS on ONNX Runtime CPU (fp32): talker step + code predictor (16 KV-cached calls) +
Code2Wav (a 25-frame streaming chunk, per frame), and each exported graph's SNR against eager fp32 on the same run.

The fp32 ONNX graphs are exported exactly as the ``onnx`` target does for a recipe (temp dir), then the host loop
generates one utterance greedily with the ORT runners (talker + predictor) and decodes it on the serving schedule
(1 + 25 + 25 ...) with the ORT chunk graphs. Times are wall-clock medians per call on this machine.

    python benchmarks/qwen3_tts_frame_latency.py                  # tiny preset
    python benchmarks/qwen3_tts_frame_latency.py --preset 0.6B    # the real 0.6B config (random weights, ~10 GB peak)
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from omni_export.artifacts.provenance import git_revision, toolchain
from omni_export.artifacts.store import write_json_atomic
from omni_export.families import load_prompt_set
from omni_export.families.qwen3_tts.host import CHUNK, FIRST_CHUNK, schedule
from omni_export.exporters import ExportRequest
from omni_export.exporters.onnx import TARGET as ONNX
from omni_export.families import build_model
from omni_export.parity.metrics import log_mel_distance, snr_db
from omni_export.schemes import get_scheme


def timed(run, log):
    def wrapped(feed):
        t = time.perf_counter()
        out = run(feed)
        log.append(time.perf_counter() - t)
        return out
    return wrapped


def ms(ts):
    return round(1e3 * statistics.median(ts), 3) if ts else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--frames", type=int, default=26, help="frames to generate (26 covers the 1 + 25 schedule)")
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    a = ap.parse_args(argv)

    t0 = time.perf_counter()
    bundle = build_model("qwen3_tts", a.preset, seed=0)
    names = ("talker_step", "code_predictor_step", "code2wav_first", "code2wav")
    comps = {n: bundle.family.components[n](bundle, context=a.context) for n in names}
    host = comps["talker_step"].host
    text = load_prompt_set("qwen3_tts_parity").prompts[0]
    res = {"preset": a.preset, "context": a.context, "build_s": round(time.perf_counter() - t0, 1)}

    with tempfile.TemporaryDirectory() as tmp:
        runs, t1 = {}, time.perf_counter()
        for n, comp in comps.items():
            d = Path(tmp) / n
            d.mkdir()
            built = ONNX.export(ExportRequest(comp, get_scheme("fp32"), None, None, None), d)
            runs[n] = ONNX.execution(built, comp, None).run
        res["export_s"] = round(time.perf_counter() - t1, 1)

        ref = host.generate(text, 16, a.frames)                      # eager fp32
        tl, pl, cl = [], [], []
        got = host.generate(text, 16, a.frames, talker_run=timed(runs["talker_step"], tl),
                            pred_run=timed(runs["code_predictor_step"], pl))
        sched = schedule(len(ref.codes), FIRST_CHUNK, CHUNK)
        full = host.full_decode(ref.codes)
        wav, _ = host.stream({FIRST_CHUNK: runs["code2wav_first"], CHUNK: timed(runs["code2wav"], cl)}, ref.codes, sched)

        n_frames = len(ref.codes)
        res["parity"] = {
            "frames": n_frames,
            "codes_equal_fraction": float(np.mean(got.codes[: n_frames] == ref.codes)) if len(got.codes) >= n_frames else None,
            "talker_hidden_snr_db": round(snr_db(ref.hidden, got.hidden[: n_frames]), 2),
            "code2wav_stream_vs_full_snr_db": round(snr_db(full, wav), 2),
            "code2wav_log_mel_distance_db": round(log_mel_distance(full, wav, bundle.config.decoder.sample_rate), 4)}
        talker, pred, chunk = ms(tl), ms(pl), ms(cl)
        res["latency_ms"] = {"talker_step": talker, "code_predictor_call": pred, "code_predictor_frame": round(16 * pred, 3),
                             "code2wav_chunk_25": chunk, "code2wav_per_frame": round(chunk / CHUNK, 3) if chunk else None}
        res["latency_ms"]["frame_total"] = round(talker + 16 * pred + (chunk / CHUNK if chunk else 0.0), 3)
        res["realtime_factor"] = round(res["latency_ms"]["frame_total"] / 80.0, 3)   # one frame is 80 ms of audio
    res["toolchain"], res["source_revision"] = toolchain(), git_revision()
    print(json.dumps({k: v for k, v in res.items() if k != "toolchain"}, indent=2))
    if a.out:
        write_json_atomic(a.out, res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
