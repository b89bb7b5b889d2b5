"""Target ``genie``: a bundle Qualcomm's Genie runtime loads (``genie-t2t-run`` on a phone, ``libGenie.so`` here): the
decode step's model in Genie's IO form (``components.decoder_genie``) as an AR-N prompt processor (``prompt_rows``)
and an AR-1 token generator over one cache, each part of each compiled to its own QNN HTP context binary for the
recipe's SoC (no weight-shared binary: ``WEIGHT_SHARING``), plus ``genie_config.json``, ``htp_backend_ext_config.json``
and the model's ``tokenizer.json``.

fp16: the fp32 Genie-form graphs compiled with HTP fp16 precision, float32 IO (Genie's mask, cos/sin and K/V buffers
are float32; the graph maps Genie's -1000 mask fill to the project's -100 inside, so the fp16 ranges stay tight).
w8a16 (and w8a8, the int8-activation build the gate must block): the same graphs quantized, float32 IO with the
encodings inside (``genie_qdq``; the manifest records each IO tensor's encoding): the token generator under the decode
step's own QDQ policy and calibration set fed as Genie feeds it, the prompt processor (which computes position 0, the
attention sink, in Genie) calibrated on Genie's own calls over the calibration prompts. Both programs carry one set
of weight encodings (``genie_qdq.quantize_graphs`` checks it), so a weight-shared binary could store each weight once.

Parity: the parity prompts run through the Genie dialog on the HTP simulator (``runtimes.genie``): Genie runs each
prompt through the AR-N binaries and generates with the AR-1 ones; its greedy ids are the free-running figures, and
the logits Genie's sampler sees at every generated position (the first from the AR-N graph, every later one over the
K/V rows it wrote) are compared with fp32's while its ids follow fp32's. Genie does not hand out K/V rows, so the
teacher-forced figures (logits and every new K/V row, per position) come from the bundle's AR-1 context binaries run
by onnxruntime's QNN EP on the HTP simulator, under the decode step's host loop (``decoder_genie.step_adapter``).
The manifest names the runtime of each figure. A bundle whose files do not match its ``genie_config.json`` is not handed
to Genie: it is measured as generating nothing, and Genie's own error text, when Genie refuses a bundle, is kept with
the figures.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np

from ..artifacts.hashing import hash_file
from ..errors import UnsupportedError
from ..lowering.onnx_export import export_onnx, onnx_files
from ..lowering.parallel import WORKER_BASE, PartPool
from ..quantize.genie_qdq import IO_NOTE, cleanup, compile_float_io, io_encodings, quantize_graphs
from ..runtimes import RuntimeUnavailable
from ..runtimes.ort import cpu_session, htp_session, require_qnn, simulator_runner
from .base import Built, Execution, ExportRequest, Target
from .qnn_context import COMPILE_PER_BYTE, compile_part

CONFIG, EXT_CONFIG, TOKENIZER = "genie_config.json", "htp_backend_ext_config.json", "tokenizer.json"
RUNTIME = "genie (libGenie, QNN HTP simulator)"
MAX_PROMPT_ROWS = 128  # AI Hub Models' Genie LLM bundles: AR-128 prompt processor + AR-1 token generator
PROMPT_PROCESSOR = ("AR-{n}: Genie runs a prompt through it in calls of {n} rows (valid rows first, pad-token rows "
                    "after), then generates with AR-1 over the same cache (slot = position); AR-N = a quarter of the "
                    "context, at most 128, never C/2 (there Genie 2.51 scrambles the AR-N graph's K rows for the "
                    "AR-1 graph, measured: docs/deploy.md)")
# Measured (tests/runtimes/test_genie_dialog.py): a weight-shared context binary (both ARs, one copy of the weights)
# kills the x86 simulator's context load, in onnxruntime-qnn as in Genie (SIGSEGV)
WEIGHT_SHARING = ("none: each variant's parts are separate context binaries; a weight-shared binary of both (one set "
                  "of weight encodings makes it possible) crashes the x86 HTP simulator on load, in Genie and in "
                  "onnxruntime-qnn alike (SIGSEGV, measured), so it cannot be verified here")
FORCED_RUNTIME = "onnxruntime-qnn HTP simulator (the bundle's AR-1 context binaries)"


def prompt_rows(context: int) -> int | None:
    """The prompt processor's AR for a context of ``context`` slots: a quarter of it, at most ``MAX_PROMPT_ROWS``; None
    (AR-1 alone) below 8. Never ``context / 2``, the one N where ``past_key_in`` [.., hd, C-N] and ``past_key_out``
    [.., hd, N] have one shape: there Genie 2.51 writes the AR-N graph's K rows in a stride the AR-1 graph does not
    read (measured on the x86 simulator: tiny LM AR-16/C-32, AR-32/C-64, AR-64/C-128 and tiny Spark AR-64/C-128
    scrambled; AR-4, AR-8, AR-24 of C-32 and AR-32 of C-128 exact)."""
    n = min(MAX_PROMPT_ROWS, context // 4)
    return n if n >= 2 else None


def max_prompt_tokens(context: int, ar: int | None) -> int:
    """The longest prompt (its bos-token included) Genie 2.51 takes into a dialog whose prompt processor is AR-``ar``
    at ``context`` slots: C - N + 1 (AR-1 alone: C). Measured on the x86 simulator (tiny LM, C 32, AR-8: prompts of
    17-25 tokens generate up to C in all; 26, 27 and 30 are refused "Context Size was exceeded" before any token,
    whatever the tokens asked; docs/deploy.md)."""
    return context - (ar or 1) + 1


# A compile's peak RSS per byte of its fp32 source graph (fp16 compiles, the trained Gemma 3 270M: 1.07 GB sources,
# two compiles side by side beside the pipeline summed to 18.4 GiB of peaks); quantized sources as qnn_context's
FP16_COMPILE_PER_BYTE = 5.5


def compile_job_bytes(srcs, float_source: bool) -> int:
    """What one compile holds (``parallel.part_workers``' ``job_bytes``): a worker's base plus a per-byte rate (an
    fp32 source compiled to fp16, or a quantized one) times the largest source's files (``onnx_files``)."""
    size = max((sum((Path(s).parent / f).stat().st_size for f in onnx_files(Path(s)).values()) for s in srcs),
               default=0)
    return int(WORKER_BASE + (FP16_COMPILE_PER_BYTE if float_source else COMPILE_PER_BYTE) * size)


def genie_form(comp):
    """The component's Genie form (``components.decoder_genie.GenieForm``), or a one-line error."""
    make = getattr(comp, "genie", None)
    if make is None:
        raise UnsupportedError(f"target genie: component {comp.name} is not a decoder LM's decode_step (Genie bundles "
                               "are built from the decode step: list `components: [decode_step]` on the build)")
    return make()


def byte_tokenizer_json(vocab_size: int) -> str:
    """A ``tokenizers`` definition of the byte tokenizer (``checkpoints.tokenizer.byte_tokenizer``): byte b is id
    b + 3, ids 0/1/2 are <pad>/<s>/</s>, <s> first; ids past the byte range are ``<unused_N>`` tokens (a seeded model's
    vocabulary is larger than its tokenizer's)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers.pre_tokenizers import ByteLevel

    from ..checkpoints.tokenizer import byte_level_chars

    alphabet = ByteLevel.alphabet()  # the 256 printable stand-ins GPT-2's byte level maps bytes to
    table = dict(enumerate(byte_level_chars()))
    assert set(table.values()) == set(alphabet)
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{table[b]: b + 3 for b in range(256)}}
    vocab.update({f"<unused_{i}>": i for i in range(259, vocab_size)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.add_special_tokens(["<pad>", "<s>", "</s>"])
    return tok.to_str()



def tokenizer_json(tok, vocab_size: int) -> str:
    """The bundle's ``tokenizer.json``: the checkpoint's own ``tokenizers`` definition, or the byte tokenizer's."""
    from ..checkpoints.tokenizer import is_byte_tokenizer
    if is_byte_tokenizer(tok):
        return byte_tokenizer_json(vocab_size)
    backend = getattr(tok, "_tok", None)
    if backend is None:
        raise UnsupportedError(f"target genie: tokenizer {tok!r} has no tokenizers definition to ship")
    return backend.to_str()


def bundle_problems(directory: Path, info: dict) -> list[str]:
    """What in ``directory`` does not match its ``genie_config.json`` and the export's record ``info`` (ctx-bins
    present, in part order, with the bytes compiled; context, vocabulary, kv-dim, pos-id-dim and rope-theta of the
    graphs; the tokenizer file): empty for a bundle Genie may be handed."""
    try:
        cfg = json.loads((directory / CONFIG).read_text())["dialog"]
        htp = cfg["engine"]["backend"]["QnnHtp"]
        bins = cfg["engine"]["model"]["binary"]["ctx-bins"]
        ctx, tok = cfg["context"], cfg["tokenizer"]["path"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return [f"{CONFIG} unreadable: {type(e).__name__}: {e}"]
    out = []
    if list(bins) != list(info["ctx_bins"]):
        out.append(f"ctx-bins {bins} are not the bundle's context binaries {list(info['ctx_bins'])}")
    for b in bins:
        p = directory / b
        if not p.is_file():
            out.append(f"ctx-bin {b} is not in the bundle")
        elif b in info["ctx_bins"] and hash_file(p) != info["ctx_bins"][b]:
            out.append(f"ctx-bin {b} is not the binary compiled for this bundle")
    want = {"size": info["context"], "n-vocab": info["vocab"]}
    out += [f"context.{k} = {ctx.get(k)}, the graphs take {v}" for k, v in want.items() if ctx.get(k) != v]
    want = {"kv-dim": info["head_dim"], "pos-id-dim": info["head_dim"] // 2, "rope-theta": info["rope_theta"]}
    out += [f"QnnHtp.{k} = {htp.get(k)}, the graphs take {v}" for k, v in want.items() if htp.get(k) != v]
    if not (directory / tok).is_file():
        out.append(f"tokenizer {tok} is not in the bundle")
    return out


class Genie(Target):
    name, format = "genie", "genie-bundle"
    schemes = ("fp16", "w8a16", "w8a8")  # w8a8: the int8-activation build the gate must block
    device_specific = True
    # the prompt processor computes position 0 (the attention sink) in Genie: it calibrates on Genie's calls over the
    # calibration prompts themselves (``ExportRequest.trace_set``), not on the decode step's sink-free samples
    calibrates_on_prompts = True

    def accepts(self, component) -> None:
        """A component Genie cannot run (not a decode step, a RoPE Genie cannot express anywhere, a sliding window
        over too long a context, a tokenizer with no ``tokenizers`` definition) is one line before any work."""
        form = genie_form(component)
        tokenizer_json(form.tokenizer, form.vocab)

    def export(self, req: ExportRequest, out: Path) -> Built:
        form, device = genie_form(req.component), req.device
        if req.scheme.name not in self.schemes:
            raise UnsupportedError(f"target genie: scheme {req.scheme.name} is not implemented (only {self.schemes})")
        C = form.context
        theta, plan = form.theta, form.plan
        N = prompt_rows(C)
        variants = ({N: form.graphs(N, f"prompt_ar{N}_cl{C}")} if N else {}) | {1: form.graphs(1, f"token_ar1_cl{C}")}
        graphs = [g for gs in variants.values() for g in gs]
        quant = None
        if req.scheme.half:
            (out / ".fp32").mkdir()
            srcs = {g.name: out / ".fp32" / f"{g.name}.onnx" for g in graphs}
            for g in graphs:
                export_onnx(g.module, g, srcs[g.name])
                form.release()
            compile_, fp16 = compile_part, True
        else:  # the decode step's QDQ policy on the Genie form, float32 IO (``genie_qdq``)
            prompt_ids = None
            if N and req.scheme.calibrated:
                if req.trace_set is None:
                    raise UnsupportedError("target genie: the prompt processor calibrates on the calibration prompts "
                                           "and the export request carries none (ExportRequest.trace_set)")
                prompts, opts = req.trace_set
                prompt_ids = form.prompt_ids(prompts, opts["max_prompt_tokens"])
            srcs, quant = quantize_graphs(form, variants, req.scheme, req.calibration, out, prompt_ids)
            compile_, fp16 = compile_float_io, bool(quant["float_nodes"])
        finalized: dict[str, str] = {}  # graph -> the QNN finalization it needed (``genie_qdq.compile_float_io``)
        with PartPool(len(graphs), compile_job_bytes(srcs.values(), req.scheme.half), isolated=True) as pool:
            for g in graphs:
                pool.submit(compile_, srcs[g.name], device, fp16, out / f"{g.name}_ctx.onnx",
                            then=lambda note, n=g.name: finalized.update({n: note}) if note else None)
        if quant is not None:
            quant["io_encodings"] = {g.name: io_encodings(srcs[g.name]) for g in graphs}
            cleanup(out, graphs)
        files, bins = {}, {}
        n_parts = form.parts
        for ar, graphs in variants.items():  # Genie chains a variant's parts by tensor name, in _k_of_n order
            for k, g in enumerate(graphs):
                files[g.name] = f"{g.name}_ctx.onnx"
                (b,) = sorted(out.glob(f"{g.name}_ctx*.bin"))
                name_graph(out / files[g.name], b, g.name.rsplit("_", 3)[0], k + 1, len(graphs))
                files[f"{g.name}.context_binary"] = b.name
                bins[b.name] = hash_file(b)
        (out / TOKENIZER).write_text(tokenizer_json(form.tokenizer, form.vocab))
        tok = form.tokenizer
        eos = tok.eos_id if tok.eos_id is not None else 0  # Genie's pad rows need a valid id: no real row sees them
        # Genie puts bos-token first in every dialog (measured): the bundle names it where the tokenizer starts every
        # prompt with it, else -1
        probe = tok.encode("a")
        bos = int(tok.bos_id) if tok.bos_id is not None and probe and probe[0] == tok.bos_id else -1
        from ..runtimes.genie import write_genie_config
        write_genie_config(out, ctx_bins=list(bins), context=C, n_vocab=form.vocab,
                           bos=bos, eos=int(eos), pad=int(eos), kv_dim=form.head_dim, pos_id_dim=form.head_dim // 2,
                           rope_theta=theta, soc_model=device.soc_model, dsp_arch=f"v{device.htp_arch}")
        files.update({"genie_config": CONFIG, "htp_backend_ext_config": EXT_CONFIG, "tokenizer": TOKENIZER})
        info = {"compiled_from": ("fp32 Genie-form ONNX graphs (components.decoder_genie)" if quant is None else
                                  f"{req.scheme.name} QDQ Genie-form ONNX graphs (quantize.genie_qdq)"),
                "htp_precision": "fp16" if quant is None else "quantized (QDQ)" + (
                    ", float nodes in fp16 (enable_htp_fp16_precision)" if fp16 else ""),
                "soc_model": device.soc_model, "htp_arch": device.htp_arch,
                "context": C, "vocab": form.vocab, "head_dim": form.head_dim, "rope_theta": theta,
                "variants": {("prompt processor" if ar > 1 else "token generator"): {
                    "ar": ar, "graphs": [g.name for g in graphs]} for ar, graphs in variants.items()},
                "parts": n_parts, "ctx_bins": bins,
                "io": {"dtype": "float32 (mask, cos/sin, K/V, logits); input_ids int32" if quant is None else IO_NOTE,
                       "attention_mask": "additive, Genie's fill (0 / -1000) floored at -100 in the graph",
                       "rope": {"position_ids_cos/sin": f"half width ({form.head_dim // 2}), rope-theta {theta}",
                                "layer types on Genie's table": [lt for lt, v in plan.items() if v],
                                "layer types on their own table, gathered at the position the mask gives":
                                    [lt for lt, v in plan.items() if not v]},
                       "past_key": "transposed: [n_kv, 1, head_dim, C-AR] in, [n_kv, 1, head_dim, AR] out",
                       "past_value": "[n_kv, 1, C-AR, head_dim] in, [n_kv, 1, AR, head_dim] out",
                       "cache": "one linear cache (slot = position); unwritten slots zeroed in the graph",
                       "sliding_window": (f"{form.window}: masked in the graph from attention_mask (slots with "
                                          f">= {form.window} visible slots after them)" if form.window else None)},
                "graph_names": "<variant>_<k>_of_<n> inside each binary (Genie chains parts by that name; the "
                               "EPContext wrappers name the same graph, for onnxruntime)",
                "pad_token": int(eos), "bos": bos, "max_prompt_tokens": max_prompt_tokens(C, N),
                "prompt_processor": (PROMPT_PROCESSOR.format(n=N) if N else
                                     f"none: a context of {C} is too short for one (the prompt runs through AR-1)"),
                "weight_sharing": WEIGHT_SHARING}
        if finalized:
            info["htp_graph_finalization"] = finalized
        if quant is not None:
            info["quantization"] = {k: quant[k] for k in ("component_policy", "shared_encodings", "activation_ranges",
                                                          "float_nodes", "kv_out_requantized") if quant[k]}
            info["io"]["encodings"] = quant["io_encodings"]
            info["weight_encodings"] = quant["weight_encodings"]
        return Built(self.name, req.scheme.name, out, files, info)

    def execution(self, built, component, device) -> Execution:
        from ..runtimes.genie import genie_library

        form = genie_form(component)
        try:
            require_qnn()
            genie_library()
        except RuntimeUnavailable as e:
            return Execution(None, unavailable=str(e))
        ar1 = form.graphs(1, built.info["variants"]["token generator"]["graphs"][0].rsplit("_", 3)[0])
        runners = {g.name: _lazy(functools.partial(htp_runner, built.path(g.name), [s.name for s in g.outputs], device))
                   for g in ar1}
        return Execution(f"{RUNTIME}: greedy ids and their logits; {FORCED_RUNTIME}: teacher-forced figures",
                         form.runner(ar1, runners), bounded=True,
                         generate=functools.partial(genie_generate, built.dir, dict(built.info)))


def name_graph(wrapper: Path, binary: Path, prefix: str, k: int, n: int) -> None:
    """Give the one QNN graph of an onnxruntime-qnn context binary Genie's part name ``<prefix>..._<k>_of_<n>``
    (``runtimes.genie.rename_context_graph``: Genie chains parts only among graphs named so) and point the EPContext
    wrapper ``wrapper`` at the new name, so onnxruntime still runs the same binary."""
    import onnx

    from ..runtimes.genie import rename_context_graph

    new = rename_context_graph(binary, prefix, k, n)
    m = onnx.load(str(wrapper))
    (node,) = m.graph.node
    node.name = new
    for a in node.attribute:
        if a.name == "partition_name":
            a.s = new.encode()
    tmp = wrapper.with_name(wrapper.name + ".tmp")
    onnx.save(m, str(tmp))
    tmp.replace(wrapper)


def typed_runner(sess, output_names):
    """A runner over an onnxruntime session that feeds each input in its declared dtype (``input_ids`` int32)."""
    types = {i.name: (np.int32 if i.type == "tensor(int32)" else np.float32) for i in sess.get_inputs()}

    def run(feed):
        return sess.run(list(output_names), {k: np.ascontiguousarray(v, dtype=types[k]) for k, v in feed.items()})
    return run


def htp_runner(path: Path, output_names, device):
    return simulator_runner(lambda: htp_session(path, device, fp16=True), typed_runner, output_names)


def cpu_runner(path: Path, output_names):
    return typed_runner(cpu_session(path), output_names)


def _lazy(make):
    box = []

    def run(feed):
        if not box:
            box.append(make())
        return box[0](feed)
    return run


def genie_generate(directory: Path, info: dict, prompts: list[list[int]], n_new: list[int]) -> dict:
    """Each prompt through one Genie dialog over the bundle in ``directory`` (reset between prompts): ``{"ids": [...],
    "logits": [...], "refused": Genie's error text or the bundle's mismatch, else None}``. A bundle that does not
    match its config is not handed to Genie; a refusal generates nothing."""
    from ..runtimes.genie import GenieDialog, GenieError

    problems = bundle_problems(Path(directory), info)
    if problems:
        return {"ids": [[] for _ in prompts], "logits": [None for _ in prompts],
                "refused": "bundle does not match genie_config.json: " + "; ".join(problems)}
    most, longest = info.get("max_prompt_tokens"), max(map(len, prompts), default=0)  # bos-token included
    if most is not None and longest > most:
        return {"ids": [[] for _ in prompts], "logits": [None for _ in prompts],
                "refused": (f"not handed to Genie: a prompt of {longest} tokens (bos-token included); with this "
                            f"bundle's prompt processor Genie takes at most {most} (context - AR + 1: a longer one "
                            "is refused \"Context Size was exceeded\" whatever is asked, measured)")}
    ids, logits = [], []
    try:
        with GenieDialog(Path(directory) / CONFIG) as dialog:
            for p, n in zip(prompts, n_new):
                dialog.reset()
                if info["bos"] >= 0:  # Genie puts bos-token first in a dialog itself (measured): not twice
                    if not p or p[0] != info["bos"]:
                        raise UnsupportedError(f"target genie: a prompt does not start with bos-token {info['bos']}")
                    p = p[1:]
                got, rows = dialog.token_query(p, n, logits=True)
                ids.append([int(t) for t in got])
                logits.append(np.asarray(rows, np.float32))
    except GenieError as e:
        done = len(ids)
        return {"ids": ids + [[] for _ in prompts[done:]], "logits": logits + [None for _ in prompts[done:]],
                "refused": f"{e.status}: {e.genie_message}"[:2000]}
    # a dialog that ended short of the tokens asked stopped at its EOS id (the last id): compared up to there
    return {"ids": ids, "logits": logits, "refused": None, "stopped": [len(i) < n for i, n in zip(ids, n_new)]}


TARGET = Genie()
