"""The gemma3 family's components: the shared AR-1 decode step and AR-N prefill (``components.decoder_lm``,
``components.decoder_prefill``) over the model's graph form (``model.graph_form``: Gemma norms folded, optionally
the residual stream carried at a power-of-two scale), with a reference note naming the weights."""
from __future__ import annotations

import dataclasses

from ...components.decoder_lm import SINK_NOTE, DecodeStepComponent
from ...components.decoder_prefill import PrefillComponent
from ...components.parts import MAX_PART_BYTES
from ...schemes import QdqPolicy
from ..llama.components import prefill_rows
from .model import graph_form


def reference_note(bundle) -> str:
    from .checkpoint import loaded_info

    info = loaded_info(bundle.weights_hash)
    if info is None:
        return f"eager PyTorch fp32 ({bundle.source}), greedy over the parity prompt set"
    notes = "; ".join(info.notes)
    return (f"eager PyTorch fp32 on the checkpoint's weights as loaded ({info.source})"
            + (f": {notes}" if notes else "") + "; greedy over the parity prompt set")


def graph_bundle(bundle, residual_scale: float, branch_scale: float):
    """The bundle with its module replaced by the graph form (same weights hash: the same function)."""
    return dataclasses.replace(bundle, module=graph_form(bundle.module, residual_scale, branch_scale))


class _GraphForm:
    def _rewrite(self) -> dict:
        return dict(self.bundle.module.graph_rewrite)

    def describe(self) -> dict:
        return {**super().describe(), "graph_rewrite": self._rewrite()}


class Gemma3DecodeStep(_GraphForm, DecodeStepComponent):
    def __init__(self, bundle, context: int, parts="auto", max_part_bytes: int = MAX_PART_BYTES,
                 residual_scale: float = 1.0, branch_scale: float = 1.0, float_residual: bool = False,
                 parity_from: int = 1):
        """``residual_scale`` / ``branch_scale``: powers of two (``model.graph_form``); the fp16 recipes scale the
        residual stream down so it stays inside fp16's range. ``float_residual``: the w8a16 policy leaves the
        residual Adds and RMSNorms float (fp16 islands on the HTP), as the prefill's does: Gemma 3 270M carries
        ~35,000 in a few residual channels at every position, not only at the sink. The w8a16 study
        (docs/parity.md, ``benchmarks/gemma3_w8a16_study.py``): on CPU-QDQ the decode step measures 28.6 dB logits
        and 22.5 dB on its weakest V row under the decoder's policy, 34.7 and 31.8 dB with this option; recipe
        ``gemma3_w8a16`` sets it. ``parity_from``: as for every decode step (``DecodeStepComponent``); the
        ``gemma3_*_long`` recipes execute from past the sliding window."""
        if type(float_residual) is not bool:
            raise ValueError(f"float_residual must be true or false, got {float_residual!r}")
        super().__init__(graph_bundle(bundle, residual_scale, branch_scale), context, parts, max_part_bytes,
                         parity_from)
        self.float_residual = float_residual
        self.reference_note = f"{reference_note(bundle)}; {SINK_NOTE}"

    def qdq_policy(self, graph_name: str, module, scheme) -> QdqPolicy | None:
        policy = super().qdq_policy(graph_name, module, scheme)
        if policy is None or not self.float_residual:
            return policy
        return dataclasses.replace(policy, name=f"{policy.name}, float residual stream", float_ops=("rmsnorm", "residual_add"),
                       why={**policy.why, "fp16_islands": "residual Adds and RMSNorms float (fp16 on the HTP): the "
                                                          "residual stream's outlier channels reach ~35,000 at every "
                                                          "position"})


class Gemma3Prefill(_GraphForm, PrefillComponent):
    def __init__(self, bundle, context: int, rows: int | None = None, prompt_tokens: int | None = None,
                 simulator_calls: int | None = None, parts="auto", max_part_bytes: int = MAX_PART_BYTES,
                 calibration_chunks: int | None = None, residual_scale: float = 1.0, branch_scale: float = 1.0):
        """``rows``: default ``llama.components.prefill_rows(config, context)``; the rest as ``PrefillComponent``
        and ``Gemma3DecodeStep``."""
        rows = prefill_rows(bundle.config, context) if rows is None else rows
        super().__init__(graph_bundle(bundle, residual_scale, branch_scale), context, rows, prompt_tokens,
                         simulator_calls, parts, max_part_bytes, calibration_chunks)
        self.reference_note = reference_note(bundle)

    def feed_chunk(self, caches: dict, tokens: list[int], p0: int):
        """Pad rows repeat the chunk's last token instead of id 0 (``<pad>``), as the llama family does: pad rows'
        activations are part of the calibration set even though no real row attends to them."""
        f = super().feed_chunk(caches, tokens, p0)
        f["embeds"][0, len(tokens):] = self.embedding[tokens[-1]]
        return f


COMPONENTS = {"decode_step": Gemma3DecodeStep, "prefill": Gemma3Prefill}
