"""The checkpoint's own tokenizer (``tokenizers`` library): a Hugging Face ``tokenizer.json``, or the byte-level BPE a
GGUF embeds in its metadata; plus the byte tokenizer used with seeded random weights, behind the same interface.

``hash`` is the sha256 of a canonical serialization (sorted-key JSON of the ``tokenizers`` definition and the bos/eos
ids), so two tokenizers that encode the same way hash the same whatever file they came from.
"""
from __future__ import annotations

import json

from ..artifacts.hashing import hash_value
from ..errors import BadInput, CheckpointError

N_SPECIAL = 3  # byte tokenizer: ids 0..2 reserved (pad, bos, eos); byte b is id b + 3

# Pre-tokenizer split patterns of llama.cpp's BPE ``tokenizer.ggml.pre`` types (the same patterns the models' own
# tokenizer.json files use); the ByteLevel pre-tokenizer is GPT-2's own pattern.
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
_GGUF_CONTROL, _GGUF_USER_DEFINED = 3, 4  # llama.cpp token types that are matched whole (special tokens)


class Tokenizer:
    """encode/decode with the checkpoint's vocabulary; ``decode(encode(s)) == s`` (special tokens are kept)."""

    def __init__(self, name: str, backend, bos_id: int | None = None, eos_id: int | None = None):
        self.name = name
        self._tok = backend
        self.bos_id, self.eos_id = bos_id, eos_id
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        self.hash = hash_value({"tokenizers": json.loads(backend.to_str()), "bos_id": bos_id, "eos_id": eos_id})

    def encode(self, text: str, max_tokens: int | None = None) -> list[int]:
        ids = self._tok.encode(text).ids
        return ids[:max_tokens] if max_tokens else ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def id_to_token(self, i: int) -> str | None:
        return self._tok.id_to_token(int(i))

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def __repr__(self):
        return f"Tokenizer({self.name!r}, vocab {self.vocab_size}, bos {self.bos_id}, eos {self.eos_id})"

    def to_json(self) -> str:
        """The ``tokenizers`` definition (a ``tokenizer.json``) that encodes and decodes as this tokenizer does."""
        return self._tok.to_str()

    def save(self, path) -> None:
        """Write ``to_json()`` to ``path`` (a temporary file renamed into place)."""
        from pathlib import Path

        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.to_json(), encoding="utf-8")
        tmp.replace(path)


class _ByteTokenizer(Tokenizer):
    """UTF-8 bytes offset by 3 reserved ids (pad 0, bos 1, eos 2), bos first."""

    def __init__(self, vocab_size: int):
        if vocab_size < 256 + N_SPECIAL:
            raise BadInput(f"vocab_size {vocab_size} is too small for the byte tokenizer (needs >= 259)")
        self.name, self._tok = "bytes+3", None
        self.vocab_size, self.bos_id, self.eos_id = vocab_size, 1, 2
        self.hash = hash_value({"byte_tokenizer": self.name, "offset": N_SPECIAL, "vocab_size": vocab_size})

    def encode(self, text: str, max_tokens: int | None = None) -> list[int]:
        ids = [1] + [b + N_SPECIAL for b in text.encode("utf-8")]
        return ids[:max_tokens] if max_tokens else ids

    def decode(self, ids: list[int]) -> str:
        """Reserved ids (pad, bos, eos) give no text; an id above the byte range shows as U+FFFD."""
        out, raw = [], bytearray()
        for i in (int(i) for i in ids):
            if N_SPECIAL <= i < 256 + N_SPECIAL:
                raw.append(i - N_SPECIAL)
                continue
            out.append(raw.decode("utf-8", errors="replace"))
            raw = bytearray()
            if i >= 256 + N_SPECIAL or i < 0:
                out.append("\ufffd")
        out.append(raw.decode("utf-8", errors="replace"))
        return "".join(out)

    def id_to_token(self, i: int) -> str | None:
        return None

    def token_to_id(self, token: str) -> int | None:
        return None

    def to_json(self) -> str:
        """A ``tokenizers`` definition that encodes to this tokenizer's ids: ``<s>`` first, byte b is id b + 3 (GPT-2's
        byte-level alphabet, no merges), ids 0/1/2 the special ``<pad>``/``<s>``/``</s>``, the ids past the byte range
        (a seeded model's vocabulary is larger) special tokens ``<unused_N>``. It has no decoder: an id decodes to
        its vocabulary entry (a byte as its byte-level character), so every id has a piece of its own and a runtime
        that hands out decoded pieces (ExecuTorch's LLM runner) never hands out a lone byte that is not UTF-8."""
        from tokenizers import AddedToken, Tokenizer as Backend, models, pre_tokenizers, processors

        chars = byte_level_chars()
        vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{chars[b]: b + N_SPECIAL for b in range(256)}}
        vocab.update({f"<unused_{i}>": i for i in range(256 + N_SPECIAL, self.vocab_size)})
        tok = Backend(models.BPE(vocab=vocab, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
        specials = ["<pad>", "<s>", "</s>"] + [f"<unused_{i}>" for i in range(256 + N_SPECIAL, self.vocab_size)]
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
        return tok.to_str()


def byte_level_chars() -> list[str]:
    """GPT-2's byte -> printable character table (the ByteLevel pre-tokenizer's), in byte order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def byte_tokenizer(vocab_size: int) -> Tokenizer:
    """The byte tokenizer for seeded random weights: UTF-8 byte b is id b + 3, bos (1) first."""
    return _ByteTokenizer(vocab_size)


def is_byte_tokenizer(tok) -> bool:
    """True for the byte tokenizer (and the speech families' variant of it): no checkpoint's own vocabulary."""
    return isinstance(tok, _ByteTokenizer)


class _CodesOut(_ByteTokenizer):
    """A speech model's tokenizer: text prompts in (the byte tokenizer), audio codes out; ``decode`` shows the
    codes as ``<id>`` (they are not text). Same ids and hash as the byte tokenizer: only the display differs."""

    def __init__(self, vocab_size: int):
        super().__init__(vocab_size)
        self.name = "bytes+3 in, audio codes out"

    def decode(self, ids: list[int]) -> str:
        return "".join(f"<{int(i)}>" for i in ids)


def speech_tokenizer(text_vocab_size: int) -> Tokenizer:
    """The byte tokenizer for a TTS family's text, whose generated ids (audio codes) show as ``<id>``."""
    return _CodesOut(text_vocab_size)


# --- GGUF-embedded tokenizers -------------------------------------------------------------------------------------

def _pre_tokenizer(pre: str | None):
    from tokenizers import Regex, pre_tokenizers as pt

    if pre in (None, "default", "gpt2", "gpt-2"):
        return pt.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":  # StarCoder-style: every digit alone, then GPT-2's pattern
        return pt.Sequence([pt.Digits(individual_digits=True), pt.ByteLevel(add_prefix_space=False, use_regex=True)])
    split = {"llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT}.get(pre)
    if split is None:
        raise CheckpointError(f"GGUF tokenizer.ggml.pre {pre!r} is not supported "
                              f"(gpt-2, default, smollm, llama-bpe, qwen2)")
    return pt.Sequence([pt.Split(Regex(split), behavior="isolated", invert=False),
                        pt.ByteLevel(add_prefix_space=False, use_regex=False)])


def gguf_tokenizer(meta: dict, name: str) -> Tokenizer | None:
    """The byte-level BPE (``tokenizer.ggml.model == "gpt2"``) a GGUF embeds; None when it embeds none."""
    from tokenizers import AddedToken, Tokenizer as Backend, decoders, models, processors

    model = meta.get("tokenizer.ggml.model")
    if model is None:
        return None
    if model != "gpt2":
        raise CheckpointError(f"GGUF tokenizer.ggml.model {model!r} is not supported (only 'gpt2' byte-level BPE)")
    tokens, merges = meta.get("tokenizer.ggml.tokens"), meta.get("tokenizer.ggml.merges")
    if not tokens or merges is None:
        raise CheckpointError("GGUF gpt2 tokenizer lacks tokenizer.ggml.tokens or tokenizer.ggml.merges")
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise CheckpointError(f"GGUF tokenizer.ggml.tokens has {len(tokens) - len(vocab)} duplicate token(s)")
    pairs = []
    for m in merges:
        a, sep, b = m.partition(" ")
        if not sep or not a or not b:
            raise CheckpointError(f"GGUF tokenizer.ggml.merges entry {m!r} is not 'left right'")
        pairs.append((a, b))
    backend = Backend(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    backend.pre_tokenizer = _pre_tokenizer(meta.get("tokenizer.ggml.pre"))
    backend.decoder = decoders.ByteLevel()
    types = meta.get("tokenizer.ggml.token_type") or []
    if types and len(types) != len(tokens):
        raise CheckpointError(f"GGUF tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
    special = [tokens[i] for i, t in enumerate(types) if t in (_GGUF_CONTROL, _GGUF_USER_DEFINED)]
    backend.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in special])
    bos, eos = meta.get("tokenizer.ggml.bos_token_id"), meta.get("tokenizer.ggml.eos_token_id")
    for key, i in (("bos_token_id", bos), ("eos_token_id", eos)):
        if i is not None and not 0 <= i < len(tokens):
            raise CheckpointError(f"GGUF tokenizer.ggml.{key} {i} is outside the {len(tokens)}-token vocabulary")
    single, added = "$A", []
    if meta.get("tokenizer.ggml.add_bos_token") and bos is not None:
        single, added = f"{tokens[bos]} {single}", [(tokens[bos], bos)]
    if meta.get("tokenizer.ggml.add_eos_token") and eos is not None:
        single, added = f"{single} {tokens[eos]}", added + [(tokens[eos], eos)]
    if added:
        backend.post_processor = processors.TemplateProcessing(single=single, special_tokens=added)
    return Tokenizer(name, backend, bos, eos)
