"""The value every checkpoint reader returns (its own module, so the readers and the package import it without a
cycle)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..errors import CheckpointError
from .tokenizer import Tokenizer


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
