"""Per-artifact parity figures and the end-to-end chain of a speech recipe run (minicpmo_*, qwen3_tts_*), as JSON
with provenance, from the run report the recipe wrote into its store; the recipes' threshold reasons cite it.

    omni-export recipe minicpmo_w8a16 --store STORE
    python benchmarks/speech_figures.py STORE/runs/minicpmo_w8a16/latest.json \
        --out benchmarks/results/minicpmo_tiny_w8a16.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from omni_export.artifacts.atomic import write_json_atomic
from omni_export.artifacts.provenance import git_revision, toolchain


def figures(a: dict) -> dict:
    met = a.get("parity") or {}
    lm = met.get("lm") or {}
    return {"status": a["status"], "runtime": a.get("runtime"), "steps": met.get("steps"),
            "snr_db": {k: v["snr_db"] for k, v in (met.get("outputs") or {}).items()},
            **({k: lm.get(k) for k in ("top1_agreement", "kld_mean", "kld_p99", "greedy_agreement")} if lm else {}),
            **({"log_mel_distance": met["audio"]["log_mel_distance"]} if met.get("audio") else {})}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path, help="a run report (STORE/runs/RECIPE/latest.json)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    run = json.loads(a.report.read_text())
    e2e = {k: v for k, v in (run.get("end_to_end") or {}).items() if k != "files"}
    out = {"recipe": run["recipe"]["name"], "model": run["model"].get("source"),
           "revision": git_revision(), "toolchain": toolchain(),
           "artifacts": {x["id"]: figures(x) for x in run["artifacts"]}, "end_to_end": e2e or None,
           "timings_s": run.get("timings_s"), "peak_rss_bytes": run.get("peak_rss_bytes")}
    print(json.dumps(out["artifacts"], indent=1))
    if a.out:
        write_json_atomic(a.out, out)


if __name__ == "__main__":
    main()
