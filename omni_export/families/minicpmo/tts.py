"""The TTS head (``MiniCPMTTS``): a plain Llama (the llama family's ``LlamaModel``: 20 x 768, MHA 12 x 64) with one
6562-way codebook (``emb_code.0`` in, ``head_code.0`` out, weight norm folded on load) and the
``hidden_text_merge`` conditioning on the host: cond_i = emb_text(id_i) + L2normalize(projector_semantic(h_i)).

``TTSHead.lm()`` is the DecoderLM view the generic decode step and prefill (``components.decoder_lm`` /
``decoder_prefill``) drive: the same layers and norm, ``head_code.0`` as the LM head, ``emb_code.0`` as the input
embedding, vocabulary 6562. Conditioning rows are host inputs (``embeds``), like every gathered embedding.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..llama.model import LlamaModel
from .config import AUDIO_BOS, TEXT_EOS, MiniCPMOConfig


class Projector(nn.Module):
    """``projector_semantic``: Linear(llm_hidden -> H) + ReLU + Linear(H -> H), both with bias."""

    def __init__(self, din: int, dout: int):
        super().__init__()
        self.linear1 = nn.Linear(din, dout)
        self.linear2 = nn.Linear(dout, dout)

    def forward(self, h):
        return self.linear2(F.relu(self.linear1(h)))


class TTSLM(nn.Module):
    """The DecoderLM protocol over the head's modules (shares their parameters)."""

    def __init__(self, head: "TTSHead"):
        super().__init__()
        self.config = dataclasses.replace(head.config.tts, vocab_size=head.config.num_audio_tokens)
        self.model = head.model
        self.lm_head = head.head_code[0]
        self._emb = [head.emb_code[0]]   # a list: not a second registered copy of the table

    def input_embedding(self) -> nn.Embedding:
        return self._emb[0]

    def expected_keys(self) -> dict[str, tuple[int, ...]]:
        return {k: tuple(v.shape) for k, v in self.state_dict().items()}


class TTSHead(nn.Module):
    def __init__(self, cfg: MiniCPMOConfig):
        super().__init__()
        self.config = cfg
        H = cfg.tts.hidden_size
        self.emb_text = nn.Embedding(cfg.text_vocab_size, H)
        self.model = LlamaModel(cfg.tts)   # its embed_tokens is the checkpoint's unused 32000-row table
        self.projector_semantic = Projector(cfg.llm_hidden, H)
        self.emb_code = nn.ModuleList([nn.Embedding(cfg.num_audio_tokens, H)])
        self.head_code = nn.ModuleList([nn.Linear(H, cfg.num_audio_tokens, bias=False)])

    def lm(self) -> TTSLM:
        return TTSLM(self)

    @torch.no_grad()
    def conditions(self, text_ids, hidden: np.ndarray, last_chunk: bool) -> np.ndarray:
        """The prefill rows of one text chunk: [cond_1..cond_n, (emb_text(text_eos) on the last chunk),
        emb_text(audio_bos)] -> [n + 1 or 2, H] (fp32). ``text_eos``/``audio_bos`` are the real vocabulary's ids,
        taken modulo a smaller preset's text vocabulary."""
        ids = torch.as_tensor(np.asarray(text_ids, np.int64))
        proj = F.normalize(self.projector_semantic(torch.from_numpy(np.asarray(hidden, np.float32))), dim=-1)
        rows = [self.emb_text(ids) + proj]
        tail = ([TEXT_EOS] if last_chunk else []) + [AUDIO_BOS]
        rows.append(self.emb_text(torch.tensor(tail) % self.config.text_vocab_size))
        return torch.cat(rows).numpy()


def fold_weight_norm(g: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """W = g * v / ||v|| over each output row (``parametrizations.weight.original0`` g [O,1], ``original1`` v [O,I])."""
    return g * v / v.norm(dim=1, keepdim=True)
