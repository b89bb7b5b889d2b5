"""MiniCPM-o components. The TTS head's decode step and prefill are the generic ones (``components.decoder_lm`` /
``decoder_prefill``) over the head's DecoderLM view (``TTSHead.lm``): logits [1, 6562], static KV, new rows out,
sampling on the host.

A parity prompt becomes the head's prefill rows on the host: its text ids (the byte tokenizer over the preset's
text vocabulary), a stand-in for the LLM's final hidden states (seeded from the text: the Qwen3-8B that makes them
is not part of this model), ``hidden_text_merge`` (``TTSHead.conditions``) and the trailing text_eos / audio_bos
rows. Each row gets an id past the 6562 audio codes whose embedding is that row, so the generic host loop gathers
conditions and codes alike; every id after the prompt is an audio code chosen by the graph's own logits.
"""
from __future__ import annotations

import dataclasses
import zlib
from types import SimpleNamespace

import numpy as np

from ...checkpoints.tokenizer import byte_tokenizer
from ...components.decoder_lm import DecodeStepComponent
from ...components.decoder_prefill import PrefillComponent


def lm_bundle(bundle):
    """The bundle the generic components take: the head's DecoderLM view and its audio vocabulary."""
    lm = bundle.module.tts.lm()
    return SimpleNamespace(config=lm.config, module=lm, tokenizer=byte_tokenizer(lm.config.vocab_size),
                           source=bundle.source, weights_hash=bundle.weights_hash, head=bundle.module.tts,
                           weights=getattr(bundle, "weights", None), release=getattr(bundle, "release", _no_op))


def _no_op() -> None:
    return None


def llm_hidden(text: str, n: int, dim: int) -> np.ndarray:
    """Seeded stand-in for the LLM hidden states of ``text`` [n, dim] (same text, same rows, every run)."""
    return np.random.default_rng(zlib.crc32(text.encode("utf-8"))).standard_normal((n, dim)).astype(np.float32)


class _Conditioned:
    """``encode``: a prompt -> ids of its condition rows, appended to the gathered embedding table."""

    trace_is_token_loop = False  # its trace remaps condition ids first: the hub sends it call by call

    def _setup(self, bundle):
        self.head = bundle.head
        self.text_tokenizer = byte_tokenizer(self.head.config.text_vocab_size)
        self._rows: dict = {}

    def encode(self, prompt: str, max_prompt_tokens: int) -> list[int]:
        key = (prompt, max_prompt_tokens)
        if key not in self._rows:
            ids = self.text_tokenizer.encode(prompt, max(1, max_prompt_tokens - 2))
            rows = self.head.conditions(ids, llm_hidden(prompt, len(ids), self.head.config.llm_hidden), True)
            start = self.embedding.shape[0]
            self.embedding = np.concatenate((self.embedding, rows.astype(np.float32)))
            self._rows[key] = list(range(start, start + rows.shape[0]))
        return self._rows[key]

    def reference(self, prompts, opts):
        """The generic reference, with each sequence's condition rows kept beside it (``in.ids``, ``in.embeds``):
        a trace in another process (references are cached by content) gathers the same rows."""
        seqs = super().reference(prompts, opts)
        V = self.cfg.vocab_size
        for seq in seqs:
            ids = np.asarray([t for t in seq.tokens if t >= V], np.int64)
            seq.outputs["in.ids"], seq.outputs["in.embeds"] = ids, self.embedding[ids]
        return seqs

    def trace(self, run, reference, max_steps, forced_only: bool = False):
        """Each reference's condition rows get fresh ids past this instance's table (ids from another instance's
        ``encode`` may collide with this one's), the tokens are remapped, then the generic trace runs."""
        mapped = []
        for seq in reference:
            start = self.embedding.shape[0]
            self.embedding = np.concatenate((self.embedding, seq.outputs["in.embeds"].astype(np.float32)))
            ids = {int(t): start + i for i, t in enumerate(seq.outputs["in.ids"])}
            mapped.append(dataclasses.replace(seq, tokens=[ids.get(t, t) for t in seq.tokens]))
        return super().trace(run, mapped, max_steps, forced_only=forced_only)


class TTSHeadStep(_Conditioned, DecodeStepComponent):
    name = "tts_step"
    reference_note = ("eager PyTorch fp32 of the TTS head; prompts prefilled as hidden_text_merge conditions (seeded "
                      "stand-in LLM states), then greedy audio codes")

    def __init__(self, bundle, context: int, parts="auto"):
        b = lm_bundle(bundle)
        super().__init__(b, context, parts)
        self._setup(b)


class TTSHeadPrefill(_Conditioned, PrefillComponent):
    name = "tts_prefill"
    weight_sharing_peer = "tts_step"
    reference_note = TTSHeadStep.reference_note

    def __init__(self, bundle, context: int, rows: int = 32, prompt_tokens: int | None = None,
                 simulator_calls: int | None = None, parts="auto"):
        """``rows`` 32: a text chunk's conditions (n <= ~22, plus text_eos and audio_bos) in one call."""
        b = lm_bundle(bundle)
        super().__init__(b, context, rows, prompt_tokens, simulator_calls, parts)
        self._setup(b)
