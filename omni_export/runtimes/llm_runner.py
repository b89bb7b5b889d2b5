"""ExecuTorch's LLM runner (``executorch.extension.llm.runner.TextLLMRunner``, the Python face of ``llama_main``) over
a runner-form ``.pte`` and its ``tokenizer.json``, and the same program driven token by token through
``executorch.runtime`` (whose calls return the logits the runner's own API does not expose).

The runner hands each generated token to its callback as the tokenizer's decoded piece, never as an id:
``pieces_to_ids`` maps them back with the bundle's tokenizer (where several ids decode to one piece, the program's
own temperature-0 choice among them)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import MissingDependency
from . import RuntimeUnavailable

RUNNER = "executorch TextLLMRunner"
RUNTIME = "executorch-runtime (XnnpackBackend)"


def _llm_kernels() -> None:
    """Registers ExecuTorch's LLM kernels (``llama::update_cache``, ``llama::custom_sdpa``, which the runner form calls
    outside its XNNPACK delegates) with this process's ExecuTorch runtime; ``llama_main`` links them in."""
    try:
        import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401
    except ImportError as e:
        raise RuntimeUnavailable(f"executorch's LLM kernels (extension.llm.custom_ops) are not in this wheel: {e}") \
            from None


def _program(path: Path):
    try:
        from executorch.runtime import Runtime
    except ImportError:
        raise MissingDependency("executorch is not installed (pip install executorch)") from None
    _llm_kernels()
    from .executorch_rt import _pin_threads
    _pin_threads()
    rt = Runtime.get()
    if not rt.backend_registry.is_available("XnnpackBackend"):
        raise RuntimeUnavailable("this ExecuTorch runtime has no XnnpackBackend")
    try:
        return rt.load_program(Path(path))
    except Exception as e:
        raise RuntimeUnavailable(f"ExecuTorch cannot load {Path(path).name}: {str(e).splitlines()[0][:300]}") from None


def program_metadata(path: Path) -> dict:
    """The runner's constant methods of the program (name -> value; a list for ``get_eos_ids``) and the largest
    ``tokens`` input its ``forward`` accepts (``tokens_max`` [1, S])."""
    prog = _program(path)
    out = {}
    for name in sorted(prog.method_names):
        if name.startswith(("get_", "use_", "enable_")):
            vals = prog.load_method(name).execute([])
            out[name] = [int(v) for v in vals] if name == "get_eos_ids" else int(vals[0])
    meta = prog.metadata("forward")
    out["tokens_max"] = list(meta.input_tensor_meta(0).sizes())
    out["forward_inputs"], out["forward_outputs"] = meta.num_inputs(), meta.num_outputs()
    return out


def forced_logits(path: Path, sequences: list[list[int]]) -> list[np.ndarray]:
    """Per sequence, the program's logits [len, 1, V] with every token fed one call at a time from position 0 (the
    runner's decode path; the caches are the program's own buffers, overwritten from position 0 each sequence)."""
    import torch

    method = _program(path).load_method("forward")
    out = []
    for seq in sequences:
        rows = [method.execute([torch.tensor([[int(t)]], dtype=torch.int64), torch.tensor([p], dtype=torch.int64)])[0]
                .numpy().reshape(1, -1) for p, t in enumerate(seq)]
        out.append(np.stack(rows).astype(np.float32))
    return out


def runner_generate(pte: Path, tokenizer: Path, prompts: list[str], n_new: list[int], num_bos: int) -> tuple[list, str | None]:
    """Each prompt's greedy pieces from ``TextLLMRunner`` (temperature 0, no echo, the prompt in one prefill call);
    returns (pieces per prompt, the runner's error text or None). ``reset`` between prompts."""
    try:
        from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner
    except ImportError as e:
        raise RuntimeUnavailable(f"ExecuTorch's LLM runner is not in this wheel: {e}") from None
    _llm_kernels()
    from .executorch_rt import _pin_threads
    _pin_threads()
    try:
        runner = TextLLMRunner(str(pte), str(tokenizer))
    except Exception as e:
        return [[] for _ in prompts], f"TextLLMRunner refused the bundle: {str(e).splitlines()[0][:300]}"
    out = []
    for text, n in zip(prompts, n_new):
        pieces: list[str] = []
        runner.reset()
        try:
            runner.generate(text, GenerationConfig(echo=False, max_new_tokens=int(n), temperature=0.0,
                                                   num_bos=int(num_bos), num_eos=0), pieces.append)
        except Exception as e:
            return out + [pieces] + [[] for _ in prompts[len(out) + 1:]], \
                f"TextLLMRunner.generate failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
        out.append(pieces)
    return out, None


def pieces_to_ids(path: Path, prompt: list[int], pieces: list[str], candidates: dict[str, list[int]]) -> list[int]:
    """The ids of the runner's ``pieces`` after ``prompt``; ``candidates``: piece -> the ids the bundle's tokenizer
    decodes to it. A piece one id decodes to is that id; a piece several decode to (Gemma 3's "." is one) is the id the
    runner chose: the program ``path`` is driven as ``TextLLMRunner`` drives it (the prompt in calls of at most
    ``forward``'s rows, then one token a call, each fed the id chosen before it), and at temperature 0 the runner's
    token is the argmax of the program's logits, so among the piece's ids it is the one with the largest logit. A
    piece no id decodes to is -1 (a disagreement); after it, only pieces one id decodes to are named."""
    import torch

    ids = [c[0] if len(c) == 1 else -1 for c in (candidates.get(p, ()) for p in pieces)]
    if all(len(candidates.get(p, ())) < 2 for p in pieces):
        return ids
    prog = _program(path)
    rows = int(prog.metadata("forward").input_tensor_meta(0).sizes()[1])
    method = prog.load_method("forward")

    def feed(toks: list[int], p0: int) -> np.ndarray:
        return method.execute([torch.tensor([toks], dtype=torch.int64),
                               torch.tensor([p0], dtype=torch.int64)])[0].numpy().reshape(-1)
    for p0 in range(0, len(prompt), rows):
        logits = feed(list(prompt[p0:p0 + rows]), p0)
    for k, piece in enumerate(pieces):
        c = candidates.get(piece, ())
        if len(c) >= 2:
            ids[k] = int(c[int(np.argmax(logits[c]))])
        if ids[k] < 0:
            break  # an unnamed token cannot be fed: a piece several ids decode to after it stays -1
        if k < len(pieces) - 1:
            logits = feed([ids[k]], len(prompt) + k)
    return ids
