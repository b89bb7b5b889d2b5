"""Target ``executorch_llm``: a decoder LM's bundle for ExecuTorch's own LLM runner (``llama_main`` on a device,
``TextLLMRunner`` in Python): ``model.pte`` in the runner form (``components.decoder_runner.RunnerStep``: ids and
``input_pos`` in, logits out, caches as buffers written in place, a dynamic-length ``forward`` so the runner feeds a
prompt in one call, the runner's constant methods) lowered to XNNPACK, its cache writes and attention ExecuTorch's
LLM kernels (``llama::update_cache``, ``llama::custom_sdpa``: a runtime loading it registers them), and
``tokenizer.json``.

Parity: the free-running greedy ids come from ``TextLLMRunner.generate`` (temperature 0) on each parity prompt;
the teacher-forced logits, which the runner's API does not expose, from the same ``model.pte`` run one token a
call through ``executorch.runtime`` (``runtimes.llm_runner``). The program's K/V rows never leave it, so its
teacher-forced figures cover the logits only. A bundle whose metadata, tokenizer and program disagree is not
handed to the runner: its greedy figures are unmeasured and the gate blocks it."""
from __future__ import annotations

import functools
from pathlib import Path

from ..errors import MissingDependency, UnsupportedError
from ..lowering.torch_export import first_line, gelu_tanh_as_ops, provenance_by_reference, quiet_lowering
from ..runtimes import RuntimeUnavailable
from .base import Built, Execution, ExportRequest, Target

PROGRAM, TOKENIZER = "model.pte", "tokenizer.json"
MAX_SEQ_LEN = 128  # rows per forward call at most (the prompt's prefill); at most the context minus one
HIDDEN = "the runner form keeps its K/V caches inside the program (mutable buffers): only its logits are observable"


def max_seq_len(context: int) -> int:
    return max(2, min(MAX_SEQ_LEN, context - 1))


def eos_ids(tok) -> list[int]:
    return [int(tok.eos_id)] if tok.eos_id is not None else []


def num_bos(tok) -> int:
    """How many BOS ids the runner must put first: the tokenizer's own encoding starts with one, or not."""
    probe = tok.encode("a")
    return int(tok.bos_id is not None and bool(probe) and probe[0] == tok.bos_id)


def write_program(module, metadata: dict, seq_max: int, scheme, path: Path) -> int:
    """``torch.export`` of runner-form ``module`` with ``tokens`` of 1..``seq_max`` rows, the scheme's
    quantization, XNNPACK lowering with ``metadata`` as constant methods; the ``.pte`` written to ``path``.
    Returns the number of delegated subgraphs."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes import MemoryPlanningPass

    example = (torch.tensor([[1, 2]], dtype=torch.int64), torch.tensor([0], dtype=torch.int64))
    dims = ({1: torch.export.Dim.DYNAMIC(min=1, max=seq_max)}, {})
    with torch.no_grad():
        if scheme.dynamic_activations and scheme.weights == "int8":  # w8a8_dynamic
            from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (XNNPACKQuantizer,
                                                                                 get_symmetric_quantization_config)
            from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
            q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True))
            gm = prepare_pt2e(torch.export.export(module, example, dynamic_shapes=dims).module(), q)
            gm(*example)  # dynamic activations: no ranges are observed, this only traces the observers once
            module = convert_pt2e(gm)
            for name, buf in module.named_buffers():  # the trace wrote position 0..1's rows: start from empty caches
                if "_cache_" in name:
                    buf.zero_()
        elif scheme.weights != "fp32" or scheme.activations != "fp32":
            raise UnsupportedError(f"target executorch_llm: scheme {scheme.name} has no lowering here")
        program = gelu_tanh_as_ops(torch.export.export(module, example, dynamic_shapes=dims))
    inferred_views(program)
    dropped_empty_concats(program)
    edge = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()], constant_methods=metadata)
    n = sum(1 for nd in edge.exported_program().graph.nodes
            if nd.op == "call_function" and "executorch_call_delegate" in str(nd.target))
    et = edge.to_executorch(ExecutorchBackendConfig(memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False)))
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        et.write_to_file(f)
    tmp.replace(path)
    return n


def inferred_views(program) -> int:
    """Rewrite, in place, each view/reshape of exported ``program`` whose target shape has exactly one symbolic size
    (the dynamic row count) to infer that size (-1) instead; returns how many. XNNPACK's partitioner refuses a reshape
    with a symbolic size but takes one inferred size, so each such view would otherwise cut the program into another
    delegate (the same reshape: every other size is a positive constant, so -1 can only be the symbolic one)."""
    import torch

    views = (torch.ops.aten.view.default, torch.ops.aten.reshape.default, torch.ops.aten._unsafe_view.default)
    n = 0
    for nd in program.graph_module.graph.nodes:
        if nd.op != "call_function" or nd.target not in views:
            continue
        shape = list(nd.args[1])
        sym = [i for i, d in enumerate(shape) if not isinstance(d, int)]
        if len(sym) == 1 and all(d > 0 for i, d in enumerate(shape) if i != sym[0]):
            shape[sym[0]] = -1
            nd.args = (nd.args[0], shape, *nd.args[2:])
            n += 1
    program.graph_module.graph.eliminate_dead_code()
    program.graph_module.recompile()
    return n


def dropped_empty_concats(program) -> int:
    """Remove, in place, the inputs of each ``cat`` of exported ``program`` that have no elements (a cat left with one
    input is replaced by it); returns how many inputs. The runner form hands each layer empty caches
    (``decoder_runner.CacheAttention`` owns the real ones), so a layer that concatenates cache and new rows (one whose
    attention is not ``decoder_runner.RunnerAttention``, e.g. Spark's) only copies the new rows."""
    import torch

    n = 0
    for nd in list(program.graph_module.graph.nodes):
        if nd.op != "call_function" or nd.target != torch.ops.aten.cat.default:
            continue
        ins = list(nd.args[0])
        kept = [x for x in ins if not _no_elements(x)]
        if len(kept) == len(ins) or not kept:
            continue
        n += len(ins) - len(kept)
        if len(kept) == 1:
            nd.replace_all_uses_with(kept[0])
        else:
            nd.args = (kept, *nd.args[1:])
    program.graph_module.graph.eliminate_dead_code()
    program.graph_module.recompile()
    return n


def _no_elements(node) -> bool:
    val = getattr(node, "meta", {}).get("val")
    return val is not None and any(isinstance(d, int) and d == 0 for d in val.shape)


def bundle_problems(directory: Path, info: dict) -> list[str]:
    """What in ``directory`` disagrees with the export's record ``info``, the program's own ``forward`` and the
    tokenizer (context, rows per call, vocabulary, EOS ids, layers): empty for a bundle the runner may be handed."""
    from tokenizers import Tokenizer as Backend

    from ..runtimes.llm_runner import program_metadata
    try:
        meta = program_metadata(directory / PROGRAM)
        tok = Backend.from_file(str(directory / TOKENIZER))
    except Exception as e:  # an unreadable program or tokenizer file, a program the runtime refuses
        return [f"bundle unreadable: {type(e).__name__}: {first_line(e)}"]
    out = []
    missing = [m for m in ("get_max_seq_len", "get_max_context_len", "use_kv_cache", "enable_dynamic_shape",
                           "get_eos_ids", "get_vocab_size", "get_n_layers") if m not in meta]
    if missing:
        return [f"the program lacks the runner's constant methods {missing}"]
    seq_cap = meta["tokens_max"][1] if len(meta["tokens_max"]) == 2 else None
    if meta["get_max_seq_len"] != seq_cap:
        out.append(f"get_max_seq_len = {meta['get_max_seq_len']}, the program's forward takes at most {seq_cap} tokens")
    if meta["get_max_context_len"] != info["context"]:
        out.append(f"get_max_context_len = {meta['get_max_context_len']}, the caches hold {info['context']} rows")
    if meta["get_max_seq_len"] > meta["get_max_context_len"]:
        out.append(f"get_max_seq_len {meta['get_max_seq_len']} exceeds get_max_context_len {meta['get_max_context_len']}")
    if meta["get_vocab_size"] != info["vocab"]:
        out.append(f"get_vocab_size = {meta['get_vocab_size']}, the logits have {info['vocab']} entries")
    if tok.get_vocab_size(with_added_tokens=True) > info["vocab"]:
        out.append(f"tokenizer.json has {tok.get_vocab_size(with_added_tokens=True)} tokens, the logits {info['vocab']}")
    if meta["get_eos_ids"] != info["eos_ids"]:
        out.append(f"get_eos_ids = {meta['get_eos_ids']}, the model's EOS ids are {info['eos_ids']}")
    if meta["get_n_layers"] != info["layers"]:
        out.append(f"get_n_layers = {meta['get_n_layers']}, the program has {info['layers']} layers")
    if (meta["use_kv_cache"], meta["enable_dynamic_shape"]) != (1, 1):
        out.append("use_kv_cache and enable_dynamic_shape must be true for this program (caches inside, any S)")
    if (meta["forward_inputs"], meta["forward_outputs"]) != (2, 1):
        out.append(f"forward takes {meta['forward_inputs']} inputs and returns {meta['forward_outputs']} outputs; "
                   "the runner needs (tokens, input_pos) -> logits")
    return out


def runner_generate(directory: Path, info: dict, tok, prompts: list[list[int]], n_new: list[int]) -> dict:
    """``Execution.generate`` of a bundle: each prompt through ``TextLLMRunner`` (``runtimes.llm_runner``), its
    pieces mapped back to ids with the bundle's tokenizer (``pieces_to_ids``). A prompt is handed over as text: the
    text of its ids must encode back to exactly those ids with the bundle's tokenizer, else the bundle cannot be
    driven on it."""
    from tokenizers import Tokenizer as Backend

    from ..runtimes.llm_runner import pieces_to_ids
    from ..runtimes.llm_runner import runner_generate as generate

    empty = {"ids": [[] for _ in prompts], "logits": [None for _ in prompts]}
    problems = bundle_problems(Path(directory), info)
    if problems:
        return {**empty, "refused": "bundle does not match its program's metadata: " + "; ".join(problems)}
    backend = Backend.from_file(str(Path(directory) / TOKENIZER))
    texts = []
    for p in prompts:
        body = p[info["num_bos"]:]
        text = tok.decode(body)
        if backend.encode(text, add_special_tokens=False).ids != list(body):
            return {**empty, "refused": f"a prompt's text does not encode back to its {len(body)} ids with "
                                        f"{TOKENIZER}: the runner cannot be handed it"}
        texts.append(text)
    pieces, err = generate(Path(directory) / PROGRAM, Path(directory) / TOKENIZER, texts, n_new, info["num_bos"])
    candidates: dict[str, list[int]] = {}
    for i in range(backend.get_vocab_size(with_added_tokens=True)):
        candidates.setdefault(backend.decode([i], skip_special_tokens=False), []).append(i)
    ids = [pieces_to_ids(Path(directory) / PROGRAM, p, ps, candidates) for p, ps in zip(prompts, pieces)]
    stopped = [bool(i) and len(i) < n and i[-1] in info["eos_ids"] for i, n in zip(ids, n_new)]
    return {"ids": ids, "logits": [None for _ in prompts], "refused": err, "stopped": stopped}


def forced_trace(path: Path, reference, budget):
    """The teacher-forced trace of the program over ``reference`` (logits only: ``HIDDEN``)."""
    from ..components.base import Sequence
    from ..runtimes.llm_runner import forced_logits

    seqs = [r.tokens for r in reference]
    return [Sequence(list(t), r.n_prompt, {"logits": lg}) for t, r, lg in zip(seqs, reference, forced_logits(path, seqs))]


class ExecuTorchLLM(Target):
    name, format = "executorch_llm", "executorch-llm-bundle"
    schemes = ("fp32", "w8a8_dynamic")

    def accepts(self, component) -> None:
        runtime_forms(component, self.name)

    def export(self, req: ExportRequest, out: Path) -> Built:
        forms = runtime_forms(req.component, self.name)
        if req.scheme.name not in self.schemes:
            raise UnsupportedError(f"target {self.name}: scheme {req.scheme.name} is not implemented (only {self.schemes})")
        tok, cfg = forms.tokenizer, forms.cfg
        seq_max, eos = max_seq_len(forms.context), eos_ids(tok)
        meta = forms.runner_metadata(seq_max, eos)
        try:
            with quiet_lowering(), provenance_by_reference():
                n = write_program(forms.runner_module(req.scheme), meta, seq_max, req.scheme, out / PROGRAM)
        except ImportError as e:
            raise MissingDependency(f"ExecuTorch export needs {e.name}: {first_line(e)}") from None
        except UnsupportedError:
            raise
        except Exception as e:
            raise UnsupportedError(f"target {self.name}: lowering ({req.scheme.name}) failed: {first_line(e)}") from None
        tok.save(out / TOKENIZER)
        quant = ("XNNPACKQuantizer (pt2e), symmetric per-channel int8 weights, dynamic int8 activations"
                 if req.scheme.dynamic_activations else None)
        info = {"backend": "xnnpack", "quantizer": quant, "delegated_subgraphs": n, "metadata": meta,
                "context": forms.context, "max_seq_len": seq_max, "vocab": cfg.vocab_size, "eos_ids": eos,
                "layers": cfg.num_hidden_layers, "num_bos": num_bos(tok), "hidden_outputs": HIDDEN,
                "io": {"forward": "tokens int64 [1, S] (1 <= S <= max_seq_len), input_pos int64 [1] -> logits [1, 1, V] "
                                  "(the last row's)",
                       "cache": f"per layer K/V buffers [1, {forms.context}, n_kv, head_dim], written in place at "
                                "input_pos..input_pos+S-1 (llama::update_cache) and attended by llama::custom_sdpa",
                       "kernels": "ExecuTorch's LLM custom ops (extension/llm/custom_ops, which llama_main links; in "
                                  "Python: import executorch.extension.llm.custom_ops.custom_ops) besides XNNPACK",
                       "sliding_window": (f"{cfg.sliding_window}: masked in the graph from input_pos over the full cache"
                                          if "sliding_attention" in cfg.layer_types else None)},
                "parity_runtimes": {"free-running greedy ids": "executorch TextLLMRunner.generate (temperature 0)",
                                    "teacher-forced logits": "executorch.runtime, model.pte one token a call"}}
        return Built(self.name, req.scheme.name, out, {"model": PROGRAM, "tokenizer": TOKENIZER}, info)

    def execution(self, built, component, device) -> Execution:
        from ..runtimes.llm_runner import RUNNER, RUNTIME, program_metadata

        forms = runtime_forms(component, self.name)
        try:
            program_metadata(built.path("model"))
            from executorch.extension.llm.runner import TextLLMRunner  # noqa: F401
        except (RuntimeUnavailable, MissingDependency, ImportError) as e:
            return Execution(None, unavailable=f"{self.name}: {e}")
        return Execution(f"{RUNNER}: greedy ids; {RUNTIME}: teacher-forced logits", run=_no_step_runner,
                         trace=functools.partial(forced_trace, built.path("model")),
                         generate=functools.partial(runner_generate, built.dir, dict(built.info), forms.tokenizer))


def _no_step_runner(feed):
    raise UnsupportedError(f"target executorch_llm: {HIDDEN}; it is traced whole (Execution.trace)")


def runtime_forms(comp, target: str):
    """The decode step's forms for the runtimes' own LLM loops (``DecodeStepComponent.runtime_forms``: the runner
    form, GenAI's form), or a one-line error naming what ``target`` cannot build."""
    make = getattr(comp, "runtime_forms", None)
    if make is None or getattr(comp, "rows", None) is not None:
        raise UnsupportedError(f"target {target}: component {comp.name} is not a decoder LM's decode_step (these "
                               "bundles are built from the decode step: list `components: [decode_step]` on the build)")
    try:
        return make()
    except UnsupportedError as e:
        raise UnsupportedError(f"target {target}: {e}") from None


TARGET = ExecuTorchLLM()
