"""SmolLM2-135M Genie bundles on the HTP simulator: Genie's greedy text beside eager fp32's, with figures and wall time.

One run, on the trained SmolLM2-135M-Instruct of a recipe (``smollm2_fp16``, ``smollm2_w8a16``):

- the recipe's ``genie`` build(s): taken from ``--store`` when a run of the recipe shelved them there, else built
  by the project's own ``Pipeline`` over the recipe restricted to its genie builds (same name, model, context,
  device, prompts, parity settings and thresholds; ``components: [decode_step]``), so the bundle is the one the
  recipe publishes and the gate's figures (``manifest.json``) come from that run;
- the first ``--prompts`` parity prompts (the recipe's ``prompts.parity`` set, cut at its ``max_prompt_tokens``)
  through one Genie dialog over the bundle (``runtimes.genie.GenieDialog.token_query(..., logits=True)``: libGenie
  of the installed onnxruntime-qnn on its x86 HTP simulator; reset between prompts), ``--new-tokens`` greedy
  tokens each, and through the eager fp32 model (the decode-step component's reference);
- per prompt: the prompt text and ids, fp32's and Genie's greedy ids and text (decoded with the bundle's
  ``tokenizer.json``), the first generated position where they differ, the logits SNR / top-1 agreement / KLD of
  the logits Genie's sampler saw against fp32's at every generated position while Genie's ids follow fp32's (the
  diverging position included: its logits still follow the same prefix), Genie's wall time and rates.

Genie feeds the prompt through the bundle's AR-N prompt processor in calls of N rows (one token per AR-1 call when
the bundle has none: the manifest's ``info.prompt_processor``), then one AR-1 call per generated token; the simulator
is an x86 emulation of the HTP's numerics, so its rates say nothing of a phone's speed.

    python benchmarks/genie_smollm2.py --recipe smollm2_deploy --scheme fp16 --prompts 3 --new-tokens 16 \\
        --out benchmarks/results/genie_smollm2_fp16.json

Writes JSON with provenance (git SHA, toolchain versions, machine and its load, the command line, each bundle's
manifest hash and verdict, the gate's parity figures) and prints a table.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from tabulate import tabulate

from omni_export.artifacts.atomic import write_json_atomic
from omni_export.artifacts.hashing import hash_file
from omni_export.artifacts.provenance import git_revision, toolchain
from omni_export.artifacts.store import Store
from omni_export.devices import get_device
from omni_export.exporters.genie import CONFIG, TOKENIZER, bundle_problems
from omni_export.families import build_model, load_prompt_set
from omni_export.parity.lm_metrics import lm_stats
from omni_export.parity.metrics import snr_db
from omni_export.pipeline import Pipeline
from omni_export.recipes import load_recipe
from omni_export.runtimes.genie import GenieDialog, GenieError

TARGET, COMPONENT = "genie", "decode_step"
SHELVES = ("published", "blocked")  # a bundle the gate judged; ``unverified`` means no Genie ran it: nothing to show


def genie_builds(recipe) -> list:
    builds = [b for b in recipe.builds if b.target == TARGET]
    if not builds:
        raise SystemExit(f"recipe {recipe.name} has no {TARGET} build (builds: "
                         f"{', '.join(f'{b.target}/{b.scheme}' for b in recipe.builds)})")
    return builds


def restricted(recipe):
    """The recipe with its genie builds alone, over the decode step alone (the genie target builds from it)."""
    builds = tuple(dataclasses.replace(b, components=(COMPONENT,)) for b in genie_builds(recipe))
    return dataclasses.replace(
        recipe, builds=builds, components=(COMPONENT,),
        options={k: v for k, v in recipe.options.items() if k == COMPONENT},
        description=f"{recipe.description} [restricted to its {TARGET} builds by benchmarks/genie_smollm2.py]")


def artifact_ids(recipe) -> list[str]:
    soc = get_device(recipe.device).chipset.lower()
    return [f"{COMPONENT}.{b.scheme}.{TARGET}.{soc}" for b in genie_builds(recipe)]


def shelved(store: Path, recipe_name: str, aid: str) -> tuple[Path, str] | None:
    for shelf in SHELVES:
        d = store / shelf / recipe_name / aid
        if (d / "manifest.json").is_file():
            return d, shelf
    return None


def build_bundles(recipe, store: Path, console: Console):
    """Run the recipe restricted to its genie builds into ``store``: (pipeline, run result, wall seconds)."""
    pipe = Pipeline(restricted(recipe), Store(store), console)
    t = time.perf_counter()
    res = pipe.run()
    return pipe, res, time.perf_counter() - t


def decoder(directory: Path):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(directory / TOKENIZER))
    return lambda ids: tok.decode([int(i) for i in ids], skip_special_tokens=False)


def figures(ref: np.ndarray, got: np.ndarray) -> dict:
    """SNR (dB), top-1 agreement and KL(fp32 || Genie) of logits rows [n, V] at the same positions."""
    s = lm_stats(ref, got)
    return {"positions": len(ref), "logits_snr_db": round(snr_db(ref, got), 3),
            "top1_agreement": round(s.same_top_p, 4),
            "kld_mean": s.kld_mean, "kld_p99": s.kld_p99, "kld_max": s.kld_max}


def run_bundle(directory: Path, manifest: dict, refs, prompts: list[str], decode) -> dict:
    """Every prompt through one Genie dialog over the bundle (reset between prompts), against fp32's ``refs``."""
    info = manifest["artifact"]["export"]
    problems = bundle_problems(directory, info)
    if problems:  # never hand Genie a bundle whose files are not its config's
        raise SystemExit(f"{directory.name}: bundle does not match {CONFIG}: {'; '.join(problems)}")
    bos = int(info["bos"])
    ar = (info.get("variants") or {}).get("prompt processor", {}).get("ar", 1)
    eos_cfg = json.loads((directory / CONFIG).read_text())["dialog"]["context"]["eos-token"]
    eos = set(eos_cfg) if isinstance(eos_cfg, list) else {eos_cfg}
    t = time.perf_counter()
    rows, ref_all, got_all = [], [], []
    with GenieDialog(directory / CONFIG) as dialog:
        create_s = time.perf_counter() - t
        for text, r in zip(prompts, refs):
            ids = list(map(int, r.tokens[:r.n_prompt]))
            fed = ids
            if bos >= 0:  # Genie puts bos-token first in a dialog itself (runtimes.genie): not twice
                if not ids or ids[0] != bos:
                    raise SystemExit(f"prompt {text!r} does not start with bos-token {bos}")
                fed = ids[1:]
            n_new = len(r.generated)
            dialog.reset()
            t0, logits_error = time.perf_counter(), None
            try:
                got, logits = dialog.token_query(fed, n_new, logits=True)
            except GenieError as e:  # the logits query failed: Genie's own greedy ids without them, the error kept
                logits_error, logits = f"{e.status}: {e.genie_message}"[:2000], None
                dialog.reset()
                t0 = time.perf_counter()
                got = dialog.token_query(fed, n_new)
            wall = time.perf_counter() - t0
            got, ref_ids = [int(x) for x in got], [int(x) for x in r.generated]
            n = min(len(got), len(ref_ids))
            first = next((j for j in range(n) if got[j] != ref_ids[j]), None)
            upto = n if first is None else first + 1
            ref_l = r.outputs["logits"].reshape(len(r.outputs["logits"]), -1)[r.n_prompt - 1: r.n_prompt - 1 + upto]
            if logits is not None:
                got_l = np.asarray(logits, np.float32).reshape(len(logits), -1)[:len(ref_l)]
                ref_all.append(ref_l)
                got_all.append(got_l)
            # the prompt in calls of the prompt processor's AR (AR-1 when there is none), a call per generated
            # token but the last
            calls = -(-len(ids) // ar) + max(len(got) - 1, 0)
            stopped = len(got) < n_new
            rows.append({
                "prompt": text, "prompt_ids": ids, "genie_fed_ids": fed,
                "fp32_ids": ref_ids, "fp32_text": decode(ref_ids),
                "genie_ids": got, "genie_text": decode(got),
                "first_difference": first, "agreed_tokens": n if first is None else first,
                "genie_stopped_early": stopped,
                **({"fp32_next_is_eos": len(got) < len(ref_ids) and ref_ids[len(got)] in eos} if stopped else {}),
                "genie_vs_fp32_while_ids_agree": figures(ref_l, got_l) if logits is not None else None,
                **({"logits_error": logits_error} if logits_error else {}),
                "wall_s": round(wall, 2), "graph_calls": calls, "s_per_call": round(wall / calls, 3) if calls else None,
                "calls_per_s": round(calls / wall, 4), "generated_tokens_per_s": round(len(got) / wall, 4)})
    total = sum(r["wall_s"] for r in rows)
    return {"dialog_create_s": round(create_s, 2), "prompts": rows,
            "all_prompts": {"genie_vs_fp32_while_ids_agree": (figures(np.concatenate(ref_all), np.concatenate(got_all))
                                                              if ref_all else None),
                            "prompts_with_logits": len(ref_all),
                            "identical_greedy_ids": sum(r["first_difference"] is None and
                                                        len(r["genie_ids"]) == len(r["fp32_ids"]) for r in rows),
                            "wall_s": round(total, 2), "graph_calls": sum(r["graph_calls"] for r in rows),
                            "calls_per_s": round(sum(r["graph_calls"] for r in rows) / total, 4),
                            "generated_tokens_per_s": round(sum(len(r["genie_ids"]) for r in rows) / total, 4)}}


def gate_figures(manifest: dict) -> dict:
    """What the gate recorded: the runtime of each figure, steps asked and measured, figures, verdict."""
    p = manifest["parity"]
    return {"runtime": p["runtime"], "bounded_steps": p.get("bounded_steps"), "asked_steps": p.get("asked_steps"),
            "prompt_set": p.get("prompt_set"), "metrics": p.get("metrics"), "verdict": manifest["verdict"],
            "thresholds": manifest.get("thresholds"), "recipe": manifest["recipe"],
            "prompt_processor": manifest["artifact"]["export"].get("prompt_processor")}


def machine(load_start: tuple, load_end: tuple) -> dict:
    shared = max(load_start[0], load_end[0]) > 0.5
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "loadavg_start": [round(x, 2) for x in load_start],
            "loadavg_end": [round(x, 2) for x in load_end],
            "note": ("other work ran on this machine (1-min load above 0.5 at start or end): wall times are upper "
                     "bounds") if shared else "machine idle"}


def fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(results: dict) -> str:
    head = ["bundle", "prompt", "agree", "first diff", "SNR dB", "top-1", "KLD mean", "wall s", "calls/s",
            "fp32 | Genie"]
    body = []
    for aid, res in results.items():
        for i, r in enumerate(res["prompts"]):
            f = r["genie_vs_fp32_while_ids_agree"] or {}
            body.append([aid, i, f"{r['agreed_tokens']}/{len(r['fp32_ids'])}",
                         "-" if r["first_difference"] is None else r["first_difference"],
                         *(fmt(f.get(k), spec) for k, spec in (("logits_snr_db", ".1f"), ("top1_agreement", ".3f"),
                                                               ("kld_mean", ".2e"))), f"{r['wall_s']:.0f}",
                         f"{r['calls_per_s']:.3f}", f"{r['fp32_text']!r}\n{r['genie_text']!r}"])
    return tabulate(body, head, tablefmt="simple", disable_numparse=True)


def gate_lines(bundles: dict) -> list[str]:
    """One line per bundle: its verdict and the gate's own figures (teacher-forced, and its Genie free run)."""
    out = []
    for aid, b in bundles.items():
        m = b["gate"]["metrics"] or {}
        g, lm, outs = m.get("generator") or {}, m.get("lm") or {}, m.get("outputs") or {}
        kv = min(((v.get("snr_db"), k) for k, v in outs.items() if k != "logits" and v.get("snr_db") is not None),
                 default=(None, None))
        out.append(f"{aid}: verdict {b['verdict']} ({b['shelf']}); gate, teacher-forced ({m.get('steps')} steps): "
                   f"logits {(outs.get('logits') or {}).get('snr_db')} dB, weakest K/V {kv[0]} dB ({kv[1]}), top-1 "
                   f"{lm.get('top1_agreement')}, KLD mean {lm.get('kld_mean')}; gate, Genie free run: "
                   f"{g.get('positions')} positions, SNR {g.get('logits_snr_db')} dB, top-1 {g.get('top1_agreement')}, "
                   f"refused: {g.get('refused')}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scheme", help="only the genie build of this scheme (fp16, w8a16); default: every genie build")
    ap.add_argument("--recipe", default="smollm2_deploy",
                    help="a recipe with a genie build (smollm2_deploy)")
    ap.add_argument("--store", type=Path, help="a store holding the recipe's genie bundle(s), or where to build them "
                                                "(default: a fresh temporary directory, kept)")
    ap.add_argument("--rebuild", action="store_true",
                    help="run the restricted recipe even where the store already shelves the bundle")
    ap.add_argument("--prompts", type=int, default=3, help="parity prompts used (from the first)")
    ap.add_argument("--new-tokens", type=int, default=16, help="greedy tokens per prompt")
    ap.add_argument("--out", type=Path, default=Path("genie_smollm2.json"))
    a = ap.parse_args(argv)
    if a.prompts < 1 or a.new_tokens < 1:
        ap.error("--prompts and --new-tokens must be at least 1")
    args = list(sys.argv[1:] if argv is None else argv)
    for flag in ("--store", "--out"):  # the machine's paths stay out of the recorded command
        if flag in args[:-1]:
            args[args.index(flag) + 1] = "DIR" if flag == "--store" else "OUT.json"
    command = shlex.join(["python", "benchmarks/genie_smollm2.py", *args])
    load_start, revision = os.getloadavg(), git_revision()  # the code the run starts with
    console = Console(stderr=True)
    recipe = load_recipe(a.recipe)
    if a.scheme is not None:
        recipe = dataclasses.replace(recipe, builds=tuple(b for b in recipe.builds
                                                          if b.target != TARGET or b.scheme == a.scheme))
    store = a.store or Path(tempfile.mkdtemp(prefix="genie-smollm2-"))
    ids = artifact_ids(recipe)
    found = {aid: shelved(store, recipe.name, aid) for aid in ids}
    build = None
    if a.rebuild or any(v is None for v in found.values()):
        console.log(f"running recipe {recipe.name} restricted to its {TARGET} builds into {store}")
        pipe, res, build_s = build_bundles(recipe, store, console)
        build = {"restricted_recipe_hash": pipe.recipe.hash, "exit_code": res.exit_code, "wall_s": round(build_s, 1),
                 "report": str(res.report_dir.relative_to(store)), "stages_s": pipe.timings}
        bundle, comp = pipe.bundle, pipe.components[COMPONENT]
        found = {aid: shelved(store, recipe.name, aid) for aid in ids}
    else:
        console.log(f"taking {', '.join(ids)} from {store}")
        latest = store / "runs" / recipe.name / "latest.json"
        run = json.loads(latest.read_text()) if latest.is_file() else None
        build = {"taken_from_store": True, "run_report": (
            {"created": run.get("created"), "recipe_hash": run.get("recipe_hash"), "exit_code": run.get("exit_code"),
             "stages_s": run.get("timings_s")} if run else f"no runs/{recipe.name}/latest.json in the store")}
        bundle = build_model(recipe.model.family, recipe.model.preset, recipe.model.seed,
                             _checkpoint(recipe.model.checkpoint))
        comp = bundle.family.components[COMPONENT](bundle, context=recipe.context, **recipe.options.get(COMPONENT, {}))
    missing = [aid for aid, v in found.items() if v is None]
    if missing:
        raise SystemExit(f"the gate put {', '.join(missing)} on no judged shelf ({'/'.join(SHELVES)}) of {store}: "
                         "see its manifest under unverified/")

    prompt_set = load_prompt_set(recipe.prompts.parity)
    prompts = list(prompt_set.prompts[:a.prompts])
    refs = comp.reference(dataclasses.replace(prompt_set, prompts=tuple(prompts)),
                          {"max_prompt_tokens": recipe.prompts.max_prompt_tokens, "new_tokens": a.new_tokens})
    results, bundles = {}, {}
    for aid, (d, shelf) in found.items():
        manifest = json.loads((d / "manifest.json").read_text())
        if manifest["model"].get("weights_hash") != bundle.provenance().get("weights_hash"):
            raise SystemExit(f"{aid}: the shelved bundle was built from other weights than {recipe.model.checkpoint}")
        console.log(f"{aid}: {len(prompts)} prompt(s) x {a.new_tokens} new tokens through Genie")
        results[aid] = run_bundle(d, manifest, refs, prompts, decoder(d))
        bundles[aid] = {"shelf": shelf, "location": str(d.relative_to(store)),
                        "manifest_sha256": hash_file(d / "manifest.json"), "manifest_created": manifest.get("created"),
                        "verdict": manifest["verdict"]["status"], "scheme": manifest["scheme"]["name"],
                        "soc": manifest["artifact"]["export"].get("soc_model"),
                        "files": {fn: m["sha256"] for fn, m in manifest["artifact"]["files"].items()},
                        "gate": gate_figures(manifest)}

    result = {"benchmark": "SmolLM2 Genie bundles on the HTP simulator: Genie's greedy text beside eager fp32's",
              "command": command, "recipe": recipe.name, "recipe_hash": recipe.hash,
              "store": "DIR (given with --store)" if a.store else "a fresh temporary directory",
              "build": build, "model": bundle.provenance(),
              "prompt_set": prompt_set.name, "prompt_set_hash": prompt_set.hash, "prompts": len(prompts),
              "max_prompt_tokens": recipe.prompts.max_prompt_tokens, "new_tokens": a.new_tokens,
              "context": recipe.context,
              "genie_runtime": "libGenie.so of onnxruntime-qnn on its x86 HTP simulator, one dialog per bundle, "
                               "reset between prompts; greedy via a custom sampler that sees every generated "
                               "position's float32 logits (runtimes.genie.GenieDialog.token_query(logits=True))",
              "fp32_reference": "eager fp32 decode loop on the dequantized GGUF weights "
                                "(DecodeStepComponent.reference)",
              "figures_note": "logits figures over every generated position while Genie's ids equal fp32's, the "
                              "first differing position included (its logits follow the same prefix); rates are the "
                              "x86 simulator's, not a phone's",
              "toolchain": toolchain(), "source_revision": revision,
              "bundles": bundles, "results": results, "machine": machine(load_start, os.getloadavg())}
    write_json_atomic(a.out, result)
    print(table(results))
    for line in gate_lines(bundles):
        print(line)
    print(f"wrote {a.out}")
    return 0


def _checkpoint(spec: str | None):
    from omni_export.families.llama.checkpoint import resolve_checkpoint
    return resolve_checkpoint(spec)


if __name__ == "__main__":
    raise SystemExit(main())
