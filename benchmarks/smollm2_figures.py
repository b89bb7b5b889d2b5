"""Per-artifact parity figures of a smollm2_* recipe run (the trained SmolLM2-135M-Instruct), as JSON with provenance.

Reads the published (and blocked) manifests a run wrote into its store; the smollm2 recipes' threshold reasons cite
the results this writes.

    omni-export recipe smollm2_w8a16 --store STORE
    python benchmarks/smollm2_figures.py STORE smollm2_w8a16 --out benchmarks/results/smollm2_w8a16.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from omni_export.artifacts.provenance import git_revision, toolchain
from omni_export.artifacts.atomic import write_json_atomic


def figures(manifest: dict) -> dict:
    par = manifest.get("parity") or {}
    met = par.get("metrics") or {}
    outs = met.get("outputs") or {}
    kv = [v["snr_db"] for k, v in outs.items() if k.startswith(("k_new", "v_new"))]
    return {"verdict": (manifest.get("verdict") or {}).get("status"), "runtime": par.get("runtime"),
            "steps": met.get("steps"), "logits_snr_db": (outs.get("logits") or {}).get("snr_db"),
            "min_kv_snr_db": min(kv) if kv else None, "lm": met.get("lm"), "reference": par.get("reference")}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store", type=Path)
    ap.add_argument("recipe")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    rows = {}
    for state in ("published", "blocked"):
        for m in sorted((a.store / state / a.recipe).glob("*/manifest.json")):
            rows[f"{m.parent.name} ({state})"] = figures(json.loads(m.read_text()))
    latest = a.store / "runs" / a.recipe / "latest.json"
    run = json.loads(latest.read_text()) if latest.is_file() else {}
    out = {"recipe": a.recipe, "revision": git_revision(), "toolchain": toolchain(), "artifacts": rows,
           "timings_s": run.get("timings_s"), "peak_rss_bytes": run.get("peak_rss_bytes")}
    print(json.dumps(rows, indent=1))
    if a.out:
        write_json_atomic(a.out, out)


if __name__ == "__main__":
    main()
