"""SmolLM2-135M, the LLM runtimes' own bundles side by side: our ExecuTorch runner bundle against ExecuTorch's own
``export_llama`` program, our onnxruntime-genai bundle and llama.cpp, same weights, same prompts, one run.

Every side is exported (or quantized) in this run, each export in its own child process (wall time, peak RSS from
``os.wait4``):

- ours, ``executorch_llm`` (the runner bundle ``TextLLMRunner`` / ``llama_main`` load) per ``--our-schemes`` and
  ``onnx_genai`` fp32, each built by the target's own ``export`` from the ``smollm2_deploy`` recipe's checkpoint;
- theirs, ``examples/models/llama/export_llama`` (XNNPACK, KV cache and custom SDPA in the program) of a temporary
  Meta-layout checkpoint written from the same fp32 weights, per ``--their-schemes`` (``llm_side_by_side.py``);
- llama.cpp (``llama-cpp-python``) on the recipe's Q4_1 GGUF as shipped and on its Q8_0 requantization
  (``llama_model_quantize``, ``allow_requantize``), which stores the same dequantized weights at 8 bits. The
  quantization and a first evaluation of each GGUF run in child processes: a llama-cpp-python build that crashes
  leaves its rows with the error and the other sides are still timed.

Speed: the two ExecuTorch programs share one contract, ``forward(tokens [1, S], input_pos [1]) -> logits``, and are
driven by the same loop through ``executorch.runtime``: the prompt in one call (prefill), then one generated token a
call (decode, greedy). GenAI: ``Generator.append_tokens`` of the prompt, then ``generate_next_token``; llama.cpp:
``eval`` of the prompt, then one token a call. After one untimed pass per side, ``--passes`` timed passes over every
prompt are interleaved (pass i of every side before pass i + 1 of any, the order rotated each pass), so load on the
shared machine falls on all sides alike; each side's figure is its median pass, ratios are ours / theirs of the
medians, and the per-pass ratios are kept. Fidelity: KL(fp32 || runtime) and top-1 over the teacher-forced positions
(from position 1, one token a call) of the eager fp32 model's greedy continuation, and how many of the untimed
pass's greedy tokens equal the reference's.

    python benchmarks/llm_runner_side_by_side.py --out benchmarks/results/llm_runner_side_by_side.json
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from tabulate import tabulate

from llm_side_by_side import (THEIR_SCHEMES, first_error_line, fidelity, measured_process, meta_checkpoint,  # sibling
                              pin_threads, rates, summed)

from omni_export.artifacts.atomic import write_json_atomic
from omni_export.artifacts.hashing import hash_file
from omni_export.artifacts.provenance import git_revision, toolchain
from omni_export.devices import get_device
from omni_export.exporters import ExportRequest, get_target
from omni_export.families import build_model, load_prompt_set
from omni_export.families.llama.checkpoint import resolve_checkpoint
from omni_export.recipes import load_recipe
from omni_export.schemes import get_scheme

RECIPE = "smollm2_deploy"
OUR_SCHEMES = {"executorch_llm": ("fp32", "w8a8_dynamic"), "onnx_genai": ("fp32",)}
# theirs at the same dtype as ours: export_llama scheme per our executorch_llm scheme
SAME_DTYPE = {"fp32": "fp32", "w8a8_dynamic": "int8_dynamic"}
GGUF_TYPES = {"Q4_1": None, "Q8_0": 7}  # llama.cpp ftype ids (LLAMA_FTYPE_MOSTLY_Q8_0 = 7); None: the file as shipped


# -- exports, each in a measured child process -----------------------------------------------------------------
def export_child(target: str, scheme: str, out: Path, threads: int) -> None:
    """``--export-child``: the recipe's checkpoint, its decode step, the target's own export into ``out``."""
    pin_threads(threads)
    recipe = load_recipe(RECIPE)
    bundle = build_model(recipe.model.family, recipe.model.preset, recipe.model.seed,
                         resolve_checkpoint(recipe.model.checkpoint))
    comp = bundle.family.components["decode_step"](bundle, context=recipe.context)
    get_target(target).export(ExportRequest(comp, get_scheme(scheme), get_device(recipe.device), None, None), out)


def our_export(target: str, scheme: str, out: Path, threads: int) -> dict:
    out.mkdir(parents=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--export-child", f"{target}/{scheme}",
           "--export-dir", str(out), "--threads", str(threads)]
    r = measured_process(cmd, out.parent / f"{out.name}.log", out.parent, {**os.environ, "OMP_NUM_THREADS": str(threads)})
    res = {"export_wall_s": r["wall_s"], "export_peak_rss_bytes": r["peak_rss_bytes"], "exit_code": r["exit_code"],
           "export_record": "child process: checkpoint load, decode step, the target's export; os.wait4 peak RSS"}
    if r["exit_code"] != 0:
        res["error"] = first_error_line(r["log"])
    else:
        res["artifact_bytes"] = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    return res


def their_export(ckpt: Path, params: Path, scheme: str, out: Path, context: int, threads: int) -> dict:
    """``export_llama`` (as ``llm_side_by_side.their_export``), its ``.pte`` kept in ``out``."""
    name = f"smollm2_{scheme}.pte"
    flags = ["--model", "smollm2", "-kv", "--use_sdpa_with_kv_cache", "-X", "-d", "fp32", "--max_seq_length",
             str(context - 1), "--max_context_length", str(context), *THEIR_SCHEMES[scheme]]
    cmd = [sys.executable, "-m", "executorch.examples.models.llama.export_llama", *flags, "--checkpoint", str(ckpt),
           "--params", str(params), "--output_name", name, "-o", str(out)]
    r = measured_process(cmd, out / f"export_{scheme}.log", out, {**os.environ, "OMP_NUM_THREADS": str(threads)})
    res = {"flags": flags, "export_wall_s": r["wall_s"], "export_peak_rss_bytes": r["peak_rss_bytes"],
           "exit_code": r["exit_code"]}
    if r["exit_code"] != 0 or not (out / name).is_file():
        res["error"] = first_error_line(r["log"])
    else:
        res["pte"], res["artifact_bytes"] = str(out / name), (out / name).stat().st_size
    return res


def gguf_q8_0(src: Path, dst: Path, threads: int) -> None:
    """``--llama-child quantize``: ``src`` requantized to Q8_0 into ``dst``; exits non-zero if llama.cpp fails."""
    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize, params.nthread = GGUF_TYPES["Q8_0"], True, threads
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    if rc != 0 or not dst.is_file():
        raise SystemExit(f"llama_model_quantize returned {rc}")


def gguf_probe(gguf: Path, threads: int, context: int) -> None:
    """``--llama-child probe``: load ``gguf`` and evaluate a few tokens, as the timing process would."""
    LlamaCppSide(gguf, 1, threads, context).generate([1, 2, 3, 4])


def llama_child(what: str, args: list[str], work: Path, threads: int) -> dict:
    """Run ``gguf_q8_0`` or ``gguf_probe`` in a child process (``measured_process``): llama-cpp-python crashes
    (SIGSEGV) on some builds, which would take the whole run with it. The child's wall time, or the error."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--llama-child", what, *args, "--threads", str(threads)]
    r = measured_process(cmd, work / f"llama_{what}.log", work, {**os.environ, "OMP_NUM_THREADS": str(threads)})
    if r["exit_code"] != 0:
        how = f"killed by signal {-r['exit_code']}" if r["exit_code"] < 0 else f"exit code {r['exit_code']}"
        return {"error": f"llama-cpp-python {what} ({how} in a child process): {first_error_line(r['log'] or '-')}"}
    return {"wall_s": r["wall_s"]}


def llama_rows(gguf: Path, work: Path, threads: int, context: int) -> dict:
    """The llama.cpp rows: Q4_1 as shipped, Q8_0 requantized; each kept only if a child process could load it and
    evaluate tokens with it (else the row holds that child's error and the side is not loaded here)."""
    rows = {"llama.cpp Q4_1": {"weights": "GGUF Q4_1 (as shipped)", "artifact_bytes": gguf.stat().st_size}}
    q8 = work / "q8_0.gguf"
    made = llama_child("quantize", [str(gguf), str(q8)], work, threads)
    rows["llama.cpp Q8_0"] = ({"error": made["error"]} if "error" in made else
                              {"quantize_s": made["wall_s"], "artifact_bytes": q8.stat().st_size,
                               "weights": "Q8_0 requantized from the Q4_1 GGUF (allow_requantize): the same "
                                          "dequantized weights at 8 bits"})
    for label, path in (("llama.cpp Q4_1", gguf), ("llama.cpp Q8_0", q8)):
        if "error" not in rows[label]:
            probe = llama_child("probe", [str(path), str(context)], work, threads)
            if "error" in probe:
                rows[label]["error"] = probe["error"]
    return rows


# -- sides: generate(prompt) -> rates and ids, teacher_forced(tokens) -> logits [n, V] -------------------------------
class ExecuTorchSide:
    """A ``forward(tokens, input_pos) -> logits`` program (ours and export_llama's alike) through executorch.runtime."""

    def __init__(self, pte: Path, n_new: int):
        import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (export_llama's llama:: kernels)
        from executorch.runtime import Runtime
        self.method = Runtime.get().load_program(Path(pte)).load_method("forward")
        self.n_new = n_new

    def run(self, tokens: list[int], pos: int) -> np.ndarray:
        out = self.method.execute([torch.tensor([tokens], dtype=torch.long), torch.tensor([pos], dtype=torch.long)])
        return out[0].numpy().reshape(-1, out[0].shape[-1])[-1]

    def generate(self, prompt):
        t = time.perf_counter()
        logits = self.run(prompt, 0)
        prefill, decode, pos, ids = time.perf_counter() - t, 0.0, len(prompt), []
        for _ in range(self.n_new):
            ids.append(int(np.argmax(logits)))
            t = time.perf_counter()
            logits = self.run([ids[-1]], pos)
            decode += time.perf_counter() - t
            pos += 1
        return rates(prefill, len(prompt), decode, self.n_new), ids

    def teacher_forced(self, tokens):
        return np.stack([self.run([tok], pos) for pos, tok in enumerate(tokens)])

    def close(self):
        self.method = None


class GenaiSide:
    """Our GenAI bundle through ``onnxruntime_genai`` (greedy); the session's intra-op threads set in its config."""

    def __init__(self, bundle: Path, n_new: int, threads: int, context: int):
        import onnxruntime_genai as og
        cfg_path = bundle / "genai_config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["model"]["decoder"]["session_options"].update(intra_op_num_threads=threads, inter_op_num_threads=1)
        cfg_path.write_text(json.dumps(cfg, indent=1))
        self.og, self.model, self.n_new, self.context = og, og.Model(str(bundle)), n_new, context

    def _generator(self, length: int):
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(do_sample=False, max_length=length, batch_size=1)
        return self.og.Generator(self.model, params)

    def generate(self, prompt):
        gen = self._generator(len(prompt) + self.n_new + 1)
        t = time.perf_counter()
        gen.append_tokens(np.asarray([prompt], np.int32))
        prefill = time.perf_counter() - t
        gen.generate_next_token()  # the first generated token, from the prefill's logits (no model call)
        ids, decode, calls = [int(gen.get_next_tokens()[0])], 0.0, 0
        while calls < self.n_new and not gen.is_done():  # each call runs the model on the last token, picks the
            t = time.perf_counter()                        # next; GenAI ends a sequence at EOS: fewer calls then
            gen.generate_next_token()
            decode += time.perf_counter() - t
            calls += 1
            ids.append(int(gen.get_next_tokens()[0]))
        return rates(prefill, len(prompt), decode, calls), ids[:self.n_new]

    def teacher_forced(self, tokens):
        gen, rows = self._generator(len(tokens) + 1), []
        for tok in tokens:
            gen.append_tokens(np.asarray([[tok]], np.int32))
            rows.append(np.asarray(gen.get_logits(), np.float32).reshape(-1))
        return np.stack(rows)

    def close(self):
        self.model = None


class LlamaCppSide:
    def __init__(self, gguf: Path, n_new: int, threads: int, context: int):
        import llama_cpp
        from llamacpp_plain import plain_cpu_buffers  # a sibling script (this directory is on sys.path)
        plain_cpu_buffers()
        self.llm = llama_cpp.Llama(str(gguf), n_ctx=context, n_batch=context, n_threads=threads,
                                   n_threads_batch=threads, logits_all=True, verbose=False)
        self.n_new = n_new

    def generate(self, prompt):
        llm = self.llm
        llm.reset()
        t = time.perf_counter()
        llm.eval(prompt)
        prefill, decode, ids = time.perf_counter() - t, 0.0, []
        for _ in range(self.n_new):
            ids.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
            t = time.perf_counter()
            llm.eval([ids[-1]])
            decode += time.perf_counter() - t
        return rates(prefill, len(prompt), decode, self.n_new), ids

    def teacher_forced(self, tokens):
        self.llm.reset()
        self.llm.eval(tokens)
        return np.array(self.llm.scores[:len(tokens)], np.float32)

    def close(self):
        self.llm.close()


# -- interleaved timing ---------------------------------------------------------------------------------------
def interleaved(sides: dict, refs, passes: int) -> dict:
    """One untimed pass per side (its greedy ids kept), then ``passes`` timed passes, interleaved across sides."""
    prompts = [r.tokens[:r.n_prompt] for r in refs]
    out = {}
    for label, side in list(sides.items()):
        try:
            ids = [side.generate(p)[1] for p in prompts]
        except Exception as e:  # a bundle that loads but does not run here: its row keeps the error
            out[label] = {"error": f"runtime: {type(e).__name__}: {first_error_line(str(e) or '-')}"}
            del sides[label]
            continue
        ref_ids = [r.tokens[r.n_prompt:] for r in refs]
        same = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), min(len(x), len(y))) for x, y in zip(ids, ref_ids)]
        out[label] = {"passes": [], "greedy_same_prefix": same, "greedy_tokens": [len(y) for y in ref_ids]}
    labels = list(sides)
    for i in range(passes):
        order = labels[i % len(labels):] + labels[:i % len(labels)]
        for label in order:
            r = summed([sides[label].generate(p)[0] for p in prompts])
            r["loadavg_1m"] = round(os.getloadavg()[0], 2)
            out[label]["passes"].append(r)
    for label, o in out.items():
        if "error" in o:
            continue
        ps = o["passes"]
        o["prefill_tok_s"] = statistics.median(p["prefill_tok_s"] for p in ps)
        o["decode_tok_s"] = statistics.median(p["decode_tok_s"] for p in ps)
        o["prefill_tok_s_passes"] = [p["prefill_tok_s"] for p in ps]
        o["decode_tok_s_passes"] = [p["decode_tok_s"] for p in ps]
        o["loadavg_passes"] = [p["loadavg_1m"] for p in ps]
        o["prompt_tokens"], o["decode_calls_per_pass"] = ps[0]["prefill_tokens"], ps[0]["decode_tokens"]
        del o["passes"]
    return out


# -- report ---------------------------------------------------------------------------------------------------
def ratios(rows: dict, pairs: list[tuple[str, str]]) -> dict:
    """ours / theirs: speeds (> 1: ours faster) of the median passes and per pass; export time and peak RSS (> 1:
    ours costs more)."""
    out = {}
    for ours, theirs in pairs:
        a, b = rows.get(ours, {}), rows.get(theirs, {})
        if "error" in a or "error" in b or not a or not b:
            continue
        r = {}
        for m in ("prefill_tok_s", "decode_tok_s", "export_wall_s", "export_peak_rss_bytes"):
            if a.get(m) and b.get(m):
                r[m] = round(a[m] / b[m], 3)
        for m in ("prefill_tok_s_passes", "decode_tok_s_passes"):
            if a.get(m) and b.get(m):
                r[m] = [round(x / y, 3) for x, y in zip(a[m], b[m])]
        out[f"{ours} / {theirs}"] = r
    return out


def fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(rows: dict) -> str:
    head = ["runtime", "prefill tok/s", "decode tok/s", "KLD mean", "KLD p99", "top-1", "greedy same", "export s",
            "export peak GiB", "size MB", "note"]
    body = []
    for k, r in rows.items():
        rss = r.get("export_peak_rss_bytes")
        same = r.get("greedy_same_prefix")
        body.append([k, fmt(r.get("prefill_tok_s"), ".1f"), fmt(r.get("decode_tok_s"), ".1f"),
                     fmt(r.get("kld_mean"), ".2e"), fmt(r.get("kld_p99"), ".2e"), fmt(r.get("top1_agreement"), ".3f"),
                     f"{sum(same)}/{sum(r['greedy_tokens'])}" if same else "-", fmt(r.get("export_wall_s"), ".1f"),
                     fmt(rss / 2**30 if rss else None, ".2f"),
                     fmt(r["artifact_bytes"] / 1e6 if r.get("artifact_bytes") else None, ".1f"),
                     (r.get("error") or "")[:80]])
    return tabulate(body, head, tablefmt="github")


def _shown(arg: str) -> str:
    """A command-line word as the JSON records it: a path inside the repository relative to it, any other absolute
    path as ``DIR`` (no machine path is written into a result)."""
    if not arg.startswith("/"):
        return arg
    try:
        return Path(arg).resolve().relative_to(Path(__file__).resolve().parents[1]).as_posix()
    except ValueError:
        return "DIR"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("llm_runner_side_by_side.json"))
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads of every runtime and export")
    ap.add_argument("--prompts", type=int, default=3, help="parity prompts used (from the first)")
    ap.add_argument("--new-tokens", type=int, default=32, help="greedy tokens per prompt")
    ap.add_argument("--passes", type=int, default=5, help="timed passes per side, interleaved")
    ap.add_argument("--our-schemes", default="fp32", help=f"executorch_llm schemes (from {OUR_SCHEMES['executorch_llm']})")
    ap.add_argument("--skip", default="", help="comma-separated sides to leave out: genai, llama_cpp")
    ap.add_argument("--work", type=Path, help="where the exports are written and kept (default: a temporary directory)")
    ap.add_argument("--reuse", type=Path, help="time the bundles an earlier run left in this directory, no exports")
    ap.add_argument("--export-child", help=argparse.SUPPRESS)
    ap.add_argument("--export-dir", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--llama-child", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.llama_child:  # the child of llama_child
        what, *args = a.llama_child
        if what == "quantize":
            gguf_q8_0(Path(args[0]), Path(args[1]), a.threads)
        else:
            gguf_probe(Path(args[0]), a.threads, int(args[1]))
        return 0
    if a.export_child:  # the measured child of our_export
        target, scheme = a.export_child.split("/")
        export_child(target, scheme, a.export_dir, a.threads)
        return 0
    schemes = [s for s in a.our_schemes.split(",") if s]
    if any(s not in OUR_SCHEMES["executorch_llm"] for s in schemes):
        ap.error(f"--our-schemes: choose from {', '.join(OUR_SCHEMES['executorch_llm'])}")
    skip = {s for s in a.skip.split(",") if s}
    load_start, t_start = os.getloadavg(), time.time()
    pin_threads(a.threads)

    recipe = load_recipe(RECIPE)
    gguf = resolve_checkpoint(recipe.model.checkpoint)
    bundle = build_model(recipe.model.family, recipe.model.preset, recipe.model.seed, gguf)
    comp = bundle.family.components["decode_step"](bundle, context=recipe.context)
    prompts = load_prompt_set(recipe.prompts.parity)
    prompts = dataclasses.replace(prompts, prompts=prompts.prompts[:a.prompts])
    refs = comp.reference(prompts, {"max_prompt_tokens": recipe.prompts.max_prompt_tokens, "new_tokens": a.new_tokens})

    rows, sides, pairs = {}, {}, []
    if a.work and not a.reuse:  # kept after the run, for --reuse and benchmarks/llm_runner_profile.py
        a.work.mkdir(parents=True, exist_ok=True)
    with (contextlib.nullcontext(a.reuse or a.work) if a.reuse or a.work else
          tempfile.TemporaryDirectory(prefix="llm-runner-sbs-")) as work:
        work = Path(work)
        if a.reuse:  # the bundles of an earlier run's --work directory, timed again; their export not measured
            reused = {"export_record": f"reused from an earlier run's export ({a.reuse.name}); not measured here"}
            for s in schemes:
                rows[f"ours executorch_llm {s}"] = dict(reused, artifact_bytes=sum(
                    f.stat().st_size for f in (work / f"etl_{s}").iterdir()))
                label = f"executorch export_llama xnnpack {SAME_DTYPE[s]}"
                pte = work / f"smollm2_{SAME_DTYPE[s]}.pte"
                rows[label] = dict(reused, pte=str(pte), artifact_bytes=pte.stat().st_size)
                pairs.append((f"ours executorch_llm {s}", label))
            if "genai" not in skip:
                rows["ours onnx_genai fp32"] = dict(reused, artifact_bytes=sum(
                    f.stat().st_size for f in (work / "genai_fp32").iterdir()))
            if "llama_cpp" not in skip:
                rows["llama.cpp Q4_1"] = {"weights": "GGUF Q4_1 (as shipped)", "artifact_bytes": gguf.stat().st_size}
                rows["llama.cpp Q8_0"] = {"weights": "Q8_0 requantized from the Q4_1 GGUF", **reused,
                                          "artifact_bytes": (work / "q8_0.gguf").stat().st_size}
                for label, path in (("llama.cpp Q4_1", gguf), ("llama.cpp Q8_0", work / "q8_0.gguf")):
                    probe = llama_child("probe", [str(path), str(recipe.context)], work, a.threads)
                    if "error" in probe:
                        rows[label]["error"] = probe["error"]
        # exports, one at a time (each a child process on the same threads)
        for s in (schemes if not a.reuse else []):
            rows[f"ours executorch_llm {s}"] = our_export("executorch_llm", s, work / f"etl_{s}", a.threads)
        if "genai" not in skip and not a.reuse:
            rows["ours onnx_genai fp32"] = our_export("onnx_genai", "fp32", work / "genai_fp32", a.threads)
        ckpt, params = meta_checkpoint(bundle.module, bundle.config, work) if not a.reuse else (None, None)
        for s in (schemes if not a.reuse else []):
            label = f"executorch export_llama xnnpack {SAME_DTYPE[s]}"
            rows[label] = their_export(ckpt, params, SAME_DTYPE[s], work, recipe.context, a.threads)
            pairs.append((f"ours executorch_llm {s}", label))
        if ckpt is not None:
            ckpt.unlink()
        if "llama_cpp" not in skip and not a.reuse:
            rows.update(llama_rows(gguf, work, a.threads, recipe.context))

        # runtimes: every side loaded, then timed interleaved; torch at one thread (docs/performance.md)
        torch.set_num_threads(1)
        for label, row in rows.items():
            if "error" in row:
                continue
            try:
                if label.startswith("ours executorch_llm"):
                    sides[label] = ExecuTorchSide(work / f"etl_{label.split()[-1]}" / "model.pte", a.new_tokens)
                elif label.startswith("executorch export_llama"):
                    sides[label] = ExecuTorchSide(Path(row.pop("pte")), a.new_tokens)
                elif label == "ours onnx_genai fp32":
                    sides[label] = GenaiSide(work / "genai_fp32", a.new_tokens, a.threads, recipe.context)
                elif label.startswith("llama.cpp"):
                    path = gguf if label.endswith("Q4_1") else work / "q8_0.gguf"
                    sides[label] = LlamaCppSide(path, a.new_tokens, a.threads, recipe.context)
            except Exception as e:  # a bundle that exported but does not load here
                row["error"] = f"load: {type(e).__name__}: {first_error_line(str(e) or '-')}"
        for label, r in interleaved(sides, refs, a.passes).items():
            rows[label].update(r)
        for label, side in sides.items():
            try:
                rows[label].update(fidelity(refs, [side.teacher_forced(r.tokens) for r in refs]))
            except Exception as e:
                rows[label]["fidelity_error"] = f"{type(e).__name__}: {first_error_line(str(e) or '-')}"
            side.close()
    for label, row in rows.items():
        row.pop("pte", None)
        row["runtime"] = ("executorch-runtime (XnnpackBackend), forward(tokens, input_pos)" if "executorch" in label
                          else "onnxruntime-genai Generator (CPU)" if "genai" in label else "llama-cpp-python")

    versions = {"llama-cpp-python": None, "onnxruntime-genai": None}
    for name, mod in (("llama-cpp-python", "llama_cpp"), ("onnxruntime-genai", "onnxruntime_genai")):
        try:
            versions[name] = __import__(mod).__version__
        except ImportError:
            pass
    load_end = os.getloadavg()
    result = {"benchmark": "SmolLM2-135M: ExecuTorch runner bundle vs export_llama, GenAI bundle, llama.cpp",
              "command": " ".join(["python", *map(_shown, sys.argv)]), "recipe": RECIPE,
              "checkpoint": recipe.model.checkpoint, "gguf_sha256": hash_file(gguf), "model": bundle.provenance(),
              "prompt_set": prompts.name, "prompts": len(refs), "prompt_tokens": [r.n_prompt for r in refs],
              "new_tokens": a.new_tokens, "context": recipe.context, "timed_passes": a.passes,
              "figure": "median pass per side; passes interleaved across sides, order rotated each pass",
              "threads": {"intra_op": a.threads, "cpu_count": os.cpu_count(), "torch_while_timing": 1},
              "fidelity_reference": "eager fp32 (the GGUF dequantized), teacher-forced one token a call over its own "
                                    "greedy continuation, positions from 1",
              "toolchain": {**toolchain(), **versions}, "source_revision": git_revision(), "results": rows,
              "ratios": ratios(rows, pairs + [("ours onnx_genai fp32", "executorch export_llama xnnpack fp32")]),
              "machine_load": {"loadavg_start": [round(x, 2) for x in load_start],
                               "loadavg_end": [round(x, 2) for x in load_end], "wall_s": round(time.time() - t_start, 1),
                               "note": "shared 2-core machine: absolute times are upper bounds; the ratios come from "
                                       "interleaved passes"}}
    write_json_atomic(a.out, result)
    print(table(rows))
    print()
    print(tabulate([[k, v.get("prefill_tok_s"), v.get("decode_tok_s"), v.get("export_wall_s"),
                     v.get("export_peak_rss_bytes")] for k, v in result["ratios"].items()],
                   ["ours / theirs", "prefill", "decode", "export s", "export RSS"], tablefmt="github"))
    print(f"\nload {result['machine_load']['loadavg_start']} -> {result['machine_load']['loadavg_end']}; wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
