"""The gemma3 family: Gemma 3 text decoders (``Gemma3ForCausalLM``, ``model_type`` gemma3_text), hybrid sliding /
full attention.

Model in ``model.py`` (config in ``config.py``), checkpoint loading in ``checkpoint.py`` (HF directories and llama.cpp
``gemma3`` GGUFs, their header read by ``gguf_header.py``; the GGUF's SentencePiece tokenizer rebuilt in
``tokenizer.py``); its components are the shared decode step and prefill over the model's graph form
(``components.py``). Its own folder rather than a llama variant:
four norms per layer in Gemma's ``1 + w`` form, the scaled embedding, GeGLU, per-type RoPE and its GGUF names and
tokenizer share little with the llama family beyond the shared layers both already use.
"""
from __future__ import annotations

from .checkpoint import GEMMA3_270M, load, resolve_checkpoint
from .config import PRESETS, Gemma3Config
from .model import Gemma3ForCausalLM, graph_form, init_random, random_tensors

__all__ = ["FAMILY", "GEMMA3_270M", "Gemma3Config", "Gemma3ForCausalLM", "PRESETS", "graph_form", "load",
           "resolve_checkpoint"]


def _family():
    from .. import Family
    from .checkpoint import tokenizer
    from .components import COMPONENTS

    def load_checkpoint(path):
        got = load(path)
        return got.config, got.module.state_dict(), got.weights_hash, got.notes

    return Family.declare("gemma3", Gemma3Config, Gemma3ForCausalLM, __file__, presets=PRESETS,
                          init_random=init_random, random_tensors=random_tensors, components=COMPONENTS,
                          load_checkpoint=load_checkpoint, tokenizer=tokenizer)


FAMILY = _family()
