"""The llama family: decoder-only Llama / SmolLM / Qwen2 / Qwen3 (``model_type`` llama, qwen2, qwen3).

Model in ``model.py`` (config in ``config.py``), checkpoint loading in ``checkpoint.py``; its components are the
shared decode step and prefill (``components.decoder_lm``), with options derived from the model (``components.py``).
"""
from __future__ import annotations


from .checkpoint import load, resolve_checkpoint
from .config import PRESETS, LlamaConfig, RopeScaling
from .model import LlamaForCausalLM, init_random, random_tensors

__all__ = ["FAMILY", "LlamaConfig", "LlamaForCausalLM", "PRESETS", "RopeScaling", "load", "resolve_checkpoint"]


def _family():
    from .. import Family
    from .checkpoint import tokenizer
    from .components import COMPONENTS

    def load_checkpoint(path):
        got = load(path)
        return got.config, got.module.state_dict(), got.weights_hash, got.notes

    return Family.declare("llama", LlamaConfig, LlamaForCausalLM, __file__, presets=PRESETS, init_random=init_random,
                          random_tensors=random_tensors, components=COMPONENTS, load_checkpoint=load_checkpoint,
                          tokenizer=tokenizer)


FAMILY = _family()
