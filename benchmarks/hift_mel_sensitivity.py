"""How much of a MiniCPM-o chain's waveform error HiFT adds by itself from an imperfect mel: eager fp32 HiFT
(the exact-window stream) on the exact mel of the first parity prompt plus white noise at a given SNR, against
the fp64 decode of the exact mel: waveform SNR, log-mel distance and the F0's SNR (HiFT's phase is the running sum
of F0, so F0 errors become phase drift). JSON with provenance.

    python benchmarks/hift_mel_sensitivity.py --out benchmarks/results/hift_mel_sensitivity_tiny.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from omni_export.artifacts.atomic import write_json_atomic
from omni_export.artifacts.provenance import git_revision, toolchain
from omni_export.families import build_model, load_prompt_set
from omni_export.families.minicpmo.graphs import eager, hift_window
from omni_export.families.minicpmo.vocoder import speech_host
from omni_export.parity.metrics import log_mel_distance, snr_db


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--snr", type=float, nargs="+", default=[130, 100, 80, 60, 40])
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    b = build_model("minicpmo", a.preset, seed=0)
    host = speech_host(b, 64)
    text = load_prompt_set("minicpmo_parity").prompts[0]
    mel = host.exact_mel(text, {"max_prompt_tokens": 16, "new_tokens": 40}).astype(np.float32)
    ref = host.hift.full_decode(mel)
    run = eager(hift_window(host.m, host.hift.W))
    f0_net = host.hift.h64().f0_predictor

    def f0(m):
        with torch.no_grad():
            return f0_net(torch.from_numpy(host.hift.ext(m)).double()[None])[0].numpy()

    f0_ref = f0(mel)
    rows = []
    for target in a.snr:
        n = np.random.default_rng(1).standard_normal(mel.shape).astype(np.float32)
        n *= np.sqrt(np.mean(mel ** 2) / np.mean(n ** 2) / 10 ** (target / 10))
        audio, _ = host.hift.stream({"hift": run}, mel + n)
        rows.append({"mel_snr_db": round(snr_db(mel, mel + n), 2), "f0_snr_db": round(snr_db(f0_ref, f0(mel + n)), 2),
                     "waveform_snr_db": round(snr_db(ref, audio), 2),
                     "log_mel_distance_db": round(log_mel_distance(ref, audio, b.config.hift.sampling_rate), 4)})
    out = {"what": __doc__.splitlines()[0], "preset": a.preset, "prompt": text, "revision": git_revision(),
           "toolchain": toolchain(), "f0_hz_range": [round(float(f0_ref.min()), 2), round(float(f0_ref.max()), 2)],
           "voiced_share": round(float((f0_ref > b.config.hift.nsf_voiced_threshold).mean()), 3), "rows": rows}
    print(json.dumps(rows, indent=1))
    if a.out:
        write_json_atomic(a.out, out)


if __name__ == "__main__":
    main()
