"""Checkpoints as users have them: Hugging Face safetensors directories (single, sharded, indexed; fp32/bf16/fp16) and
GGUF files (llama.cpp's format, quantized tensors dequantized to fp32), each with its own tokenizer when it has one.

``open_checkpoint(path)`` reads only headers and metadata; ``Checkpoint.tensor(key)`` loads, upcasts or dequantizes
one tensor on demand, so a checkpoint larger than memory is read one tensor at a time. Keys are Hugging Face names as
stored (a tied head without ``lm_head.weight`` has no such key: tying is the family's business). Anything wrong with
the input is a one-line ``CheckpointError``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import CheckpointError
from .tokenizer import Tokenizer, byte_tokenizer

__all__ = ["Checkpoint", "Tokenizer", "byte_tokenizer", "open_checkpoint"]


@dataclass
class Checkpoint:
    config: dict                      # HF config.json dict (GGUF: built from its metadata)
    keys: dict[str, tuple]            # HF-named key -> shape (PyTorch order)
    weights_hash: str                 # content hash of the weight files
    tokenizer: Tokenizer | None
    source: str                       # e.g. "hf safetensors, 2 shards, bf16"
    notes: tuple[str, ...] = ()
    _reader: object = field(default=None, repr=False, compare=False)

    def tensor(self, key: str) -> torch.Tensor:
        """The tensor ``key`` as fp32 (a fresh tensor; nothing else stays resident)."""
        if key not in self.keys:
            raise CheckpointError(f"checkpoint ({self.source}) has no tensor {key}")
        if self._reader is None:
            raise CheckpointError(f"checkpoint ({self.source}) is closed; cannot read {key}")
        return self._reader.tensor(key)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_checkpoint(path: Path) -> Checkpoint:
    """A Hugging Face directory (config.json + *.safetensors) or a ``.gguf`` file."""
    p = Path(path)
    if p.is_dir():
        from .hf import open_hf
        return open_hf(p)
    if p.is_file() and p.suffix.lower() == ".gguf":
        from .gguf import open_gguf
        return open_gguf(p)
    if not p.exists():
        raise CheckpointError(f"checkpoint {p} does not exist")
    raise CheckpointError(f"checkpoint {p} is neither a directory (config.json + *.safetensors) nor a .gguf file")
