"""Checkpoints as users have them: Hugging Face safetensors directories (single, sharded, indexed; fp32/bf16/fp16) and
GGUF files (llama.cpp's format, quantized tensors dequantized to fp32), each with its own tokenizer when it has one.

``open_checkpoint(path)`` reads only headers and metadata; ``Checkpoint.tensor(key)`` loads, upcasts or dequantizes
one tensor on demand, so a checkpoint larger than memory is read one tensor at a time. Keys are Hugging Face names as
stored (a tied head without ``lm_head.weight`` has no such key: tying is the family's business). Anything wrong with
the input is a one-line ``CheckpointError``.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import CheckpointError
from .base import Checkpoint
from .tokenizer import Tokenizer, byte_tokenizer

__all__ = ["Checkpoint", "Tokenizer", "byte_tokenizer", "open_checkpoint"]


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
