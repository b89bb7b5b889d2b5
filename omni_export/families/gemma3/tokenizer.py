"""The SentencePiece tokenizer a Gemma 3 GGUF embeds (``tokenizer.ggml.model == "llama"``: pieces, scores, types),
rebuilt as a ``tokenizers`` object the way transformers converts Gemma's tokenizer.model (``GemmaConverter``).

- BPE over the whole text (no pre-tokenizer), spaces written as U+2581 by the normalizer, byte fallback to the
  ``<0xXX>`` pieces for characters the vocabulary lacks, ``<unk>`` for none.
- Merges come from the scores: every split of a piece into two pieces of the vocabulary is a merge, ranked by the
  merged piece's score (SentencePiece BPE merges the adjacent pair whose result scores highest); splits of one
  piece in vocabulary-id order.
- Control pieces (type 3) are special tokens; user-defined pieces (type 4: newline, tab and space runs, HTML tags)
  are matched whole in the raw text before the model, as SentencePiece and llama.cpp match them.
"""
from __future__ import annotations

from ...checkpoints.tokenizer import Tokenizer
from ...errors import CheckpointError

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"


def spm_merges(tokens: list[str], scores, types) -> list[tuple[str, str]]:
    """(left, right) merges of the normal pieces, highest-scoring result first."""
    vocab = {t: i for i, t in enumerate(tokens)}
    found = []
    for i, piece in enumerate(tokens):
        if types[i] != NORMAL:
            continue
        local = [(vocab[piece[:j]], vocab[piece[j:]]) for j in range(1, len(piece))
                 if piece[:j] in vocab and piece[j:] in vocab]
        found += [(-float(scores[i]), i, lr) for lr in sorted(local)]
    found.sort(key=lambda x: (x[0], x[1]))
    return [(tokens[a], tokens[b]) for _, _, (a, b) in found]


def spm_tokenizer(meta: dict, name: str) -> Tokenizer:
    from tokenizers import AddedToken, Tokenizer as Backend, decoders, models, normalizers, processors

    tokens, scores = meta.get("tokenizer.ggml.tokens"), meta.get("tokenizer.ggml.scores")
    types = meta.get("tokenizer.ggml.token_type")
    if not tokens or scores is None or types is None:
        raise CheckpointError("GGUF llama (SentencePiece) tokenizer lacks tokenizer.ggml.tokens, scores or token_type")
    if not len(tokens) == len(scores) == len(types):
        raise CheckpointError(f"GGUF tokenizer: {len(tokens)} tokens, {len(scores)} scores, {len(types)} types")
    if len(set(tokens)) != len(tokens):
        raise CheckpointError(f"GGUF tokenizer.ggml.tokens has {len(tokens) - len(set(tokens))} duplicate token(s)")
    for key in ("tokenizer.ggml.add_space_prefix", "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_sep_token"):
        if meta.get(key):
            raise CheckpointError(f"GGUF {key} = true is not implemented by the Gemma tokenizer rebuild")
    pre = meta.get("tokenizer.ggml.pre")
    if pre not in (None, "default"):
        raise CheckpointError(f"GGUF tokenizer.ggml.pre {pre!r} is not supported with a SentencePiece model (default)")
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    bos, eos = meta.get("tokenizer.ggml.bos_token_id"), meta.get("tokenizer.ggml.eos_token_id")
    for key, i in (("unknown_token_id", unk), ("bos_token_id", bos), ("eos_token_id", eos)):
        if i is not None and not 0 <= i < len(tokens):
            raise CheckpointError(f"GGUF tokenizer.ggml.{key} {i} is outside the {len(tokens)}-token vocabulary")
    vocab = {t: i for i, t in enumerate(tokens)}
    missing = [f"<0x{b:02X}>" for b in range(256) if f"<0x{b:02X}>" not in vocab]
    if missing:
        raise CheckpointError(f"GGUF SentencePiece tokenizer has no byte-fallback piece {missing[0]}")
    backend = Backend(models.BPE(vocab=vocab, merges=spm_merges(tokens, scores, types), fuse_unk=True,
                                 byte_fallback=True, unk_token=None if unk is None else tokens[unk]))
    backend.normalizer = normalizers.Replace(" ", SPACE)
    backend.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    backend.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                        for i, t in enumerate(types) if t == USER_DEFINED])
    backend.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                for i, t in enumerate(types) if t == CONTROL])
    if meta.get("tokenizer.ggml.add_bos_token") and bos is not None:
        backend.post_processor = processors.TemplateProcessing(single=f"{tokens[bos]} $A",
                                                               special_tokens=[(tokens[bos], bos)])
    return Tokenizer(name, backend, bos, eos)
