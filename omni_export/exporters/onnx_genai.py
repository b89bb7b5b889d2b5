"""Target ``onnx_genai``: a decoder LM's bundle for onnxruntime-genai on the CPU EP: ``model.onnx`` (+ external
data) in GenAI's decoder form (``components.decoder_runner.GenaiStep``: ``input_ids``, ``attention_mask``,
``position_ids``, ``past_key_values.N.key/value`` -> ``logits``, ``present.N.key/value``, past and new rows
concatenated in the graph), ``genai_config.json``, ``tokenizer.json`` and ``tokenizer_config.json``. Schemes:
``fp32``; ``w8_block32``, the fp32 bundle's graph with its constant-weight MatMuls as onnxruntime's ``MatMulNBits``
(int8 in blocks of 32, fp32 compute: ``quantize.nbits``, what each MatMul got in the manifest); ``w8a16``, the fp32
bundle's graph as a QDQ graph under the decoder's GenAI policy, calibrated on GenAI's own calls over the calibration
prompts (``quantize.genai_qdq``, what each tensor got in the manifest).

Parity: teacher-forced figures (logits and every new K/V row) from ``model.onnx`` on onnxruntime's CPU EP under the
decode step's own host loop (``decoder_runner.genai_feed`` turns each step's feed into GenAI's inputs); the
free-running greedy ids and their logits from ``onnxruntime_genai.Generator`` over the bundle directory. A bundle
whose config disagrees with its graph or tokenizer is not handed to GenAI: its greedy figures are unmeasured."""
from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np

from ..errors import UnsupportedError
from ..lowering.onnx_export import write_program
from ..runtimes import RuntimeUnavailable
from ..runtimes.ort import cpu_session, require_ort
from .base import Built, Execution, ExportRequest, Target
from .executorch_llm import num_bos, runtime_forms

MODEL, CONFIG, TOKENIZER, TOKENIZER_CONFIG = "model.onnx", "genai_config.json", "tokenizer.json", "tokenizer_config.json"
WEIGHT_BITS = {"int8": 8, "int4": 4}  # a weight-only scheme's MatMulNBits bits
RUNTIME = "onnxruntime-genai Generator (CPU): greedy ids and their logits; onnxruntime CPU: teacher-forced figures"


def export_graph(forms, path: Path) -> None:
    """Dynamo export of the GenAI form (``forms.genai_module()``) with dynamic rows, past length and mask length."""
    import torch

    ins, outs = forms.genai_specs(3, 2)
    example = tuple(torch.zeros(s.shape, dtype=getattr(torch, s.dtype)) for s in ins)
    example[1].fill_(1)
    dyn = torch.export.Dim.DYNAMIC
    dims = ({1: dyn}, {1: dyn}, {1: dyn}, tuple({2: dyn} for _ in ins[3:]))  # forward(ids, mask, pos, *past)
    write_program(forms.genai_module(), example, path, [s.name for s in ins], [s.name for s in outs], dims)


def genai_config(cfg, context: int, bos: int | None, eos: list[int], pad: int) -> dict:
    L = cfg.num_hidden_layers
    return {"model": {
        "type": "llama", "context_length": context, "vocab_size": cfg.vocab_size,
        "bos_token_id": -1 if bos is None else bos, "eos_token_id": eos if len(eos) > 1 else (eos[0] if eos else -1),
        "pad_token_id": pad,
        "decoder": {"filename": MODEL, "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                    "head_size": cfg.head_dim, "hidden_size": cfg.hidden_size,
                    "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
                    "num_hidden_layers": L,
                    "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                               "position_ids": "position_ids", "past_key_names": "past_key_values.%d.key",
                               "past_value_names": "past_key_values.%d.value"},
                    "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                                "present_value_names": "present.%d.value"}}},
        "search": {"do_sample": False, "num_beams": 1, "num_return_sequences": 1, "max_length": context,
                   "min_length": 0, "past_present_share_buffer": False, "temperature": 1.0, "top_k": 1, "top_p": 1.0,
                   "repetition_penalty": 1.0, "length_penalty": 1.0, "early_stopping": True,
                   "no_repeat_ngram_size": 0, "diversity_penalty": 0.0}}


def tokenizer_config(tok) -> dict:
    name = lambda i: None if i is None else tok.id_to_token(i) if tok.id_to_token(i) is not None else \
        {0: "<pad>", 1: "<s>", 2: "</s>"}.get(i)
    return {"tokenizer_class": "GPT2Tokenizer", "model_max_length": 1 << 30, "add_bos_token": bool(num_bos(tok)),
            "bos_token": name(tok.bos_id), "eos_token": name(tok.eos_id), "unk_token": None, "clean_up_tokenization_spaces": False}


def bundle_problems(directory: Path, info: dict) -> list[str]:
    """What in ``directory`` disagrees with the graph (its inputs and outputs, as ONNX declares them), the export's
    record ``info`` and the tokenizer: empty for a bundle GenAI may be handed."""
    import onnx
    from tokenizers import Tokenizer as Backend

    try:
        m = json.loads((directory / CONFIG).read_text())["model"]
        dec = m["decoder"]
        graph = onnx.load(str(directory / dec["filename"]), load_external_data=False).graph
        tok = Backend.from_file(str(directory / TOKENIZER))
    except Exception as e:  # an unreadable config, graph or tokenizer file
        return [f"bundle unreadable: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"]
    ins = {i.name: [d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim] for i in graph.input}
    outs = {o.name: [d.dim_value or d.dim_param for d in o.type.tensor_type.shape.dim] for o in graph.output}
    out = []
    L = dec.get("num_hidden_layers")
    names_in = [dec["inputs"][k] for k in ("input_ids", "attention_mask", "position_ids")]
    names_in += [dec["inputs"][k] % i for i in range(L or 0) for k in ("past_key_names", "past_value_names")]
    names_out = [dec["outputs"]["logits"]] + [dec["outputs"][k] % i for i in range(L or 0)
                                              for k in ("present_key_names", "present_value_names")]
    if sorted(names_in) != sorted(ins):
        out.append(f"decoder inputs {sorted(set(names_in) ^ set(ins))[:4]} differ between config and graph")
    if sorted(names_out) != sorted(outs):
        out.append(f"decoder outputs {sorted(set(names_out) ^ set(outs))[:4]} differ between config and graph")
    kv = ins.get(dec["inputs"]["past_key_names"] % 0, [None] * 4)
    if kv[1] != dec.get("num_key_value_heads") or kv[3] != dec.get("head_size"):
        out.append(f"num_key_value_heads/head_size {dec.get('num_key_value_heads')}/{dec.get('head_size')}, the "
                   f"graph's past is {kv}")
    if outs.get("logits", [None] * 3)[-1] != m.get("vocab_size") or m.get("vocab_size") != info["vocab"]:
        out.append(f"vocab_size {m.get('vocab_size')}, the graph's logits have {outs.get('logits', [None])[-1]}")
    if m.get("context_length") != info["context"]:
        out.append(f"context_length {m.get('context_length')}, the graph's RoPE tables cover {info['context']}")
    if L != info["layers"]:
        out.append(f"num_hidden_layers {L}, the graph has {info['layers']}")
    eos = m.get("eos_token_id")
    if sorted(eos if isinstance(eos, list) else [eos]) != sorted(info["eos_ids"] or [-1]):
        out.append(f"eos_token_id {eos}, the model's EOS ids are {info['eos_ids']}")
    if tok.get_vocab_size(with_added_tokens=True) > info["vocab"]:
        out.append(f"tokenizer.json has {tok.get_vocab_size(with_added_tokens=True)} tokens, the logits {info['vocab']}")
    return out


def genai_generate(directory: Path, info: dict, prompts: list[list[int]], n_new: list[int]) -> dict:
    """``Execution.generate``: each prompt's greedy ids and the logits of every generated position from
    ``onnxruntime_genai.Generator`` over the bundle (the prompt appended as ids, one generator per prompt)."""
    empty = {"ids": [[] for _ in prompts], "logits": [None for _ in prompts]}
    problems = bundle_problems(Path(directory), info)
    if problems:
        return {**empty, "refused": f"bundle does not match {CONFIG}: " + "; ".join(problems)}
    import onnxruntime_genai as og

    try:
        model = og.Model(str(directory))
    except Exception as e:
        return {**empty, "refused": f"onnxruntime-genai refused the bundle: {str(e).splitlines()[0][:300]}"}
    ids, logits = [], []
    for p, n in zip(prompts, n_new):
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=min(info["context"], len(p) + int(n)), batch_size=1)
        gen = og.Generator(model, params)
        gen.append_tokens(np.asarray([p], np.int32))
        got, rows = [], []
        while len(got) < n and not gen.is_done():
            rows.append(np.asarray(gen.get_logits(), np.float32).reshape(-1))
            gen.generate_next_token()
            got.append(int(gen.get_next_tokens()[0]))
        ids.append(got)
        logits.append(np.stack(rows) if rows else np.zeros((0, info["vocab"]), np.float32))
    stopped = [bool(i) and len(i) < n and i[-1] in info["eos_ids"] for i, n in zip(ids, n_new)]
    return {"ids": ids, "logits": logits, "refused": None, "stopped": stopped}


def step_runner(forms, path: Path):
    """A runner over the decode step's feeds that executes ``model.onnx`` on onnxruntime's CPU EP in GenAI's IO
    (``forms.genai_feed``) and returns the decode step's outputs (logits, the new K/V row per layer)."""
    sess = cpu_session(path)
    names = [o.name for o in sess.get_outputs()]

    def run(feed):
        _, _, f = forms.genai_feed(feed)
        o = dict(zip(names, sess.run(names, f)))
        out = [o["logits"]]
        for i in range(forms.cfg.num_hidden_layers):
            out += [o[f"present.{i}.key"][:, :, -1:], o[f"present.{i}.value"][:, :, -1:]]
        return out
    return run


class OnnxGenai(Target):
    name, format = "onnx_genai", "onnx-genai-bundle"
    schemes = ("fp32", "w8_block32", "w8a16")
    BLOCK = 32  # w8_block32: int8 weights, one scale per 32 values of the reduction axis
    # w8a16 calibrates on GenAI's calls over the calibration prompts (``ExportRequest.trace_set``): the one graph
    # computes position 0, the attention sink, in every prompt call
    calibrates_on_prompts = True

    def dependencies(self, scheme: str):
        """A quantized bundle quantizes the fp32 bundle's graph (exported once)."""
        return [] if scheme == "fp32" else [(self.name, "fp32")]

    def accepts(self, component) -> None:
        runtime_forms(component, self.name)

    def export(self, req: ExportRequest, out: Path) -> Built:
        forms = runtime_forms(req.component, self.name)
        if req.scheme.name not in self.schemes:
            raise UnsupportedError(f"target {self.name}: scheme {req.scheme.name} is not implemented (only {self.schemes})")
        cfg, tok = forms.cfg, forms.tokenizer
        weights = quant = None
        if req.scheme.name == "w8a16":
            from ..quantize.genai_qdq import quantize_bundle
            if req.trace_set is None:
                raise UnsupportedError(f"target {self.name}: w8a16 calibrates on the calibration prompts and the "
                                       "export request carries none (ExportRequest.trace_set)")
            prompts, opts = req.trace_set
            ids = [forms.comp.encode(p, opts["max_prompt_tokens"]) for p in prompts.prompts]
            fp32 = req.source(*self.dependencies(req.scheme.name)[0])
            quant = quantize_bundle(forms, req.scheme, fp32.path("model"), prompts, ids, opts["new_tokens"],
                                    out / MODEL)
        elif not req.scheme.weight_only:
            try:
                export_graph(forms, out / MODEL)
            except Exception as e:
                why = str(e).splitlines()[0][:300]
                raise UnsupportedError(f"target {self.name}: ONNX export failed: {why}") from None
        else:
            from ..quantize.nbits import quantize_matmuls
            fp32 = req.source(*self.dependencies(req.scheme.name)[0])
            weights = quantize_matmuls(fp32.path("model"), out / MODEL, bits=WEIGHT_BITS[req.scheme.weights],
                                       block=self.BLOCK)
        eos = [int(tok.eos_id)] if tok.eos_id is not None else []
        conf = genai_config(cfg, forms.context, tok.bos_id, eos, eos[0] if eos else 0)
        (out / CONFIG).write_text(json.dumps(conf, indent=2))
        tok.save(out / TOKENIZER)
        (out / TOKENIZER_CONFIG).write_text(json.dumps(tokenizer_config(tok), indent=2))
        files = {"model": MODEL, "model_data": f"{MODEL}.data", "genai_config": CONFIG, "tokenizer": TOKENIZER,
                 "tokenizer_config": TOKENIZER_CONFIG}
        files = {k: v for k, v in files.items() if (out / v).exists()}
        info = {"context": forms.context, "vocab": cfg.vocab_size, "layers": cfg.num_hidden_layers, "eos_ids": eos,
                "io": "input_ids, attention_mask, position_ids, past_key_values.N.key/value -> logits, present.N.key/value "
                      "(past and new rows concatenated in the graph; past_present_share_buffer false)",
                "sliding_window": (f"{cfg.sliding_window}: masked in the graph from position_ids over the full past"
                                   if "sliding_attention" in cfg.layer_types else None),
                "provider": "cpu", "bos_prepended_by_caller": bool(num_bos(tok)),
                **({"weights": weights} if weights is not None else {}),
                **({"quantization": quant} if quant is not None else {}),
                "tokenizer": ("GenAI's tokenizer (onnxruntime-extensions) encodes text without the BOS id; this model's "
                              "prompts start with bos_token_id, which the caller puts first" if num_bos(tok) else
                              "GenAI's tokenizer encodes prompts to the model's ids")}
        return Built(self.name, req.scheme.name, out, files, info)

    def execution(self, built, component, device) -> Execution:
        forms = runtime_forms(component, self.name)
        try:
            require_ort()
            import onnxruntime_genai  # noqa: F401
        except (RuntimeUnavailable, ImportError) as e:
            return Execution(None, unavailable=f"{self.name}: onnxruntime-genai is not installed here ({e})")
        run = step_runner(forms, built.path("model"))
        return Execution(RUNTIME, run, generate=functools.partial(genai_generate, built.dir, dict(built.info)))


TARGET = OnnxGenai()
