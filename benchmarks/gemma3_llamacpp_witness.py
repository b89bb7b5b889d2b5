"""An independent check of the gemma3 family's eager fp32 model: llama.cpp on the same GGUF as the witness.

Our model (the gate's reference) dequantizes the Q4_K_M GGUF to fp32 and computes in fp32; llama.cpp computes on the
quantized blocks themselves (its CPU kernels quantize activations to 8 bits for the quantized dot products), so the
two differ by llama.cpp's own arithmetic and agree where the architecture, the weight mapping (norms stored as 1 + w,
tied head, q/k norms, sqrt(hidden) embedding scale, query scale, per-type RoPE bases) and the sliding window are the
same. Rows:

- ``parity``: each prompt of ``gemma3_parity`` with our eager fp32 greedy continuation (the decode step's reference,
  ``--new-tokens`` tokens): tokenization compared id for id (llama.cpp's tokenizer against ours, rebuilt from the
  GGUF), then KLD(ours || llama.cpp) and top-1 agreement over every position from position 1;
- ``long``: a text longer than the 512-token sliding window (the calibration prompts joined, cut to ``--long``
  tokens) through our full-sequence forward (sliding layers masked to their window) and llama.cpp: the same figures
  before and past position 512, so the window is witnessed on trained weights; the control row computes the same
  weights with the window ignored (every layer full), which must leave llama.cpp past position 512.

llama.cpp is driven through llama-cpp-python's C API (every position's logits in one ``llama_decode``) with
``use_extra_bufts`` off: this build's AMX / repacked CPU buffers end ``llama_decode`` in SIGSEGV on this machine,
and the plain CPU kernels are llama.cpp's reference path.

    python benchmarks/gemma3_llamacpp_witness.py            # writes benchmarks/results/gemma3_llamacpp_witness.json
"""
from __future__ import annotations

import argparse
import ctypes
import dataclasses
import os
import time
from pathlib import Path

import numpy as np
import torch

from omni_export.artifacts.atomic import write_json_atomic
from omni_export.artifacts.hashing import hash_file
from omni_export.artifacts.provenance import git_revision, toolchain
from omni_export.families import build_model, load_prompt_set
from omni_export.families.gemma3.checkpoint import resolve_checkpoint
from omni_export.parity.lm_metrics import lm_stats
from omni_export.parity.metrics import FIRST_POSITION
from omni_export.recipes import load_recipe

OUT = Path(__file__).parent / "results" / "gemma3_llamacpp_witness.json"
RECIPE = "gemma3_w8a16"


class LlamaCpp:
    """One llama.cpp model and context: tokenize, and the logits of every position of a sequence."""

    def __init__(self, gguf: Path, n_ctx: int, threads: int):
        import llama_cpp as L
        self.L = L
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        mp.use_extra_bufts = False
        self.model = L.llama_model_load_from_file(str(gguf).encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {gguf.name}")
        cp = L.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = n_ctx
        cp.n_threads = cp.n_threads_batch = threads
        self.ctx = L.llama_init_from_model(self.model, cp)
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)

    def tokenize(self, text: str) -> list[int]:
        raw = text.encode("utf-8")
        buf = (self.L.llama_token * (len(raw) + 8))()
        n = self.L.llama_tokenize(self.vocab, raw, len(raw), buf, len(buf), True, False)  # add BOS, text not special
        if n < 0:
            raise RuntimeError(f"llama_tokenize needs {-n} slots")
        return list(buf[:n])

    def logits(self, ids: list[int]) -> np.ndarray:
        L = self.L
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
        batch = L.llama_batch_init(len(ids), 0, 1)
        try:
            batch.n_tokens = len(ids)
            for i, t in enumerate(ids):
                batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, i, 1, 1
                batch.seq_id[i][0] = 0
            if L.llama_decode(self.ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")
            ptr = L.llama_get_logits(self.ctx)
            return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                                         shape=(len(ids), self.n_vocab)).copy()
        finally:
            L.llama_batch_free(batch)

    def close(self) -> None:
        self.L.llama_free(self.ctx)
        self.L.llama_model_free(self.model)


def figures(ours: np.ndarray, theirs: np.ndarray) -> dict:
    s = lm_stats(ours, theirs)
    return {"positions": s.positions, "kld_mean": s.kld_mean, "kld_p99": s.kld_p99, "kld_max": s.kld_max,
            "top1_agreement": s.same_top_p}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--new-tokens", type=int, default=52)
    ap.add_argument("--long", type=int, default=768, help="tokens of the long row (past the 512-token window)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    import llama_cpp
    load_start, t0 = os.getloadavg(), time.time()
    torch.set_num_threads(a.threads)
    recipe = load_recipe(RECIPE)
    gguf = resolve_checkpoint(recipe.model.checkpoint)
    bundle = build_model(recipe.model.family, recipe.model.preset, recipe.model.seed, gguf)
    comp = bundle.family.components["decode_step"](bundle, context=recipe.context)
    prompts = load_prompt_set(recipe.prompts.parity)
    refs = comp.reference(prompts, {"max_prompt_tokens": recipe.prompts.max_prompt_tokens,
                                    "new_tokens": a.new_tokens})
    window = bundle.config.sliding_window
    cpp = LlamaCpp(gguf, max(a.long, max(len(r.tokens) for r in refs)) + 8, a.threads)

    rows, ours_all, theirs_all = [], [], []
    for text, r in zip(prompts.prompts, refs):
        ids = cpp.tokenize(text)
        ours_ids = r.tokens[:r.n_prompt]
        theirs = cpp.logits(r.tokens)
        ours = r.outputs["logits"].reshape(-1, theirs.shape[-1])
        assert len(ours) == len(r.tokens), (len(ours), len(r.tokens))
        ours_all.append(ours[FIRST_POSITION:]), theirs_all.append(theirs[FIRST_POSITION:])
        rows.append({"prompt": text, "tokens": len(r.tokens), "same_prompt_ids": ids == ours_ids,
                     **figures(ours[FIRST_POSITION:], theirs[FIRST_POSITION:])})
    parity = figures(np.concatenate(ours_all), np.concatenate(theirs_all))

    text = " ".join(load_prompt_set(recipe.prompts.calibration).prompts)
    text_ids = comp.encode(text, 10 ** 6)
    long_ids = text_ids
    while len(long_ids) < a.long:
        long_ids = long_ids + long_ids[1:]  # the text again, without a second BOS
    long_ids = long_ids[:a.long]
    with torch.no_grad():
        ours = bundle.module(torch.tensor([long_ids]))[0].float().numpy()
    theirs = cpp.logits(long_ids)
    # the control: the same weights with the window ignored (every layer full) must leave llama.cpp past the window
    wide = type(bundle.module)(dataclasses.replace(bundle.config, sliding_window=10 ** 6))
    wide.load_state_dict(bundle.module.state_dict())
    with torch.no_grad():
        unwindowed = wide(torch.tensor([long_ids]))[0].float().numpy()
    del wide
    long_row = {"tokens": len(long_ids), "window": window,
                "before_window": figures(ours[FIRST_POSITION:window], theirs[FIRST_POSITION:window]),
                "past_window": figures(ours[window:], theirs[window:]),
                "control_window_ignored_past_window": figures(unwindowed[window:], theirs[window:]),
                "same_ids_as_llama_cpp": cpp.tokenize(text)[:200] == text_ids[:200]}
    cpp.close()
    result = {
        "what": "eager fp32 gemma3 (the gate's reference) against llama.cpp on the same GGUF: KLD(ours || llama.cpp) "
                f"and top-1 agreement from position {FIRST_POSITION}",
        "command": "python benchmarks/gemma3_llamacpp_witness.py",
        "checkpoint": {"name": gguf.name, "sha256": hash_file(gguf)},
        "llama_cpp": {"binding": f"llama-cpp-python {llama_cpp.__version__}", "use_extra_bufts": False,
                      "threads": a.threads},
        "parity": {"prompts": len(refs), "new_tokens": a.new_tokens, **parity, "rows": rows},
        "long": long_row,
        "git": git_revision(), "toolchain": toolchain(),
        "machine_load": {"start": load_start, "end": os.getloadavg()}, "wall_s": round(time.time() - t0, 1),
    }
    write_json_atomic(a.out, result)
    print(f"parity: {parity['positions']} positions, KLD mean {parity['kld_mean']:.2e}, top-1 "
          f"{parity['top1_agreement']:.3f}; same prompt ids {sum(r['same_prompt_ids'] for r in rows)}/{len(rows)}")
    for k in ("before_window", "past_window", "control_window_ignored_past_window"):
        f = long_row[k]
        print(f"long {k}: {f['positions']} positions, KLD mean {f['kld_mean']:.2e}, top-1 {f['top1_agreement']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
