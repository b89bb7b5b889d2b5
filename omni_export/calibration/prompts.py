"""Shipped prompt sets and the byte-level tokenizer used with seeded random weights."""
from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..artifacts.hashing import hash_value
from ..errors import BadInput

N_SPECIAL = 3  # ids 0..2 reserved (pad, bos, eos); byte b maps to id b + 3


@dataclass(frozen=True)
class PromptSet:
    name: str
    prompts: tuple[str, ...]

    @property
    def hash(self) -> str:
        return hash_value([self.name, list(self.prompts)])


def load_prompt_set(name_or_path: str) -> PromptSet:
    """A shipped set by name (``spark_parity``) or a text file path: one prompt per line, ``#`` comments."""
    p = Path(name_or_path)
    if p.suffix == ".txt" and p.exists():
        text, name = p.read_text(encoding="utf-8"), p.stem
    else:
        res = resources.files(__package__).joinpath("prompts", f"{name_or_path}.txt")
        if not res.is_file():
            raise BadInput(f"prompt set {name_or_path!r} not found (neither a shipped set nor a .txt file)")
        text, name = res.read_text(encoding="utf-8"), name_or_path
    prompts = tuple(line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#"))
    if not prompts:
        raise BadInput(f"prompt set {name!r} has no prompts")
    return PromptSet(name, prompts)


class ByteTokenizer:
    """UTF-8 bytes offset by the reserved ids, folded into the vocabulary. Deterministic and offline.

    A real checkpoint's own tokenizer changes which ids a prompt becomes, not how parity is measured."""

    name = "bytes+3"

    def __init__(self, vocab_size: int):
        if vocab_size < 256 + N_SPECIAL:
            raise BadInput(f"vocab_size {vocab_size} is too small for the byte tokenizer (needs >= 259)")
        self.vocab_size = vocab_size

    def encode(self, text: str, max_tokens: int | None = None) -> list[int]:
        ids = [1] + [b + N_SPECIAL for b in text.encode("utf-8")]
        return ids[:max_tokens] if max_tokens else ids
