"""The llama family's components: the shared AR-1 decode step and AR-N prefill (``components.decoder_lm``,
``components.decoder_prefill``), with defaults derived from the model and a reference note naming the weights."""
from __future__ import annotations

from ...components.decoder_lm import SINK_NOTE, DecodeStepComponent
from ...components.parts import MAX_PART_BYTES
from ...components.decoder_prefill import DEFAULT_ROWS, PrefillComponent
from ...blocks.layers import SLIDING


def prefill_rows(cfg, context: int) -> int:
    """Rows per prefill call: ``DEFAULT_ROWS`` (AR-128), at most half the context (so a prompt as long as the
    context crosses a chunk boundary) and, with sliding layers, at most ``sliding_window - 1`` (a chunk must fit the
    ring of the window's last rows)."""
    rows = min(DEFAULT_ROWS, max(2, context // 2))
    return min(rows, cfg.sliding_window - 1) if SLIDING in cfg.layer_types else rows


def reference_note(bundle) -> str:
    from .checkpoint import loaded_info

    info = loaded_info(bundle.weights_hash)
    if info is None:
        return f"eager PyTorch fp32 ({bundle.source}), greedy over the parity prompt set"
    notes = "; ".join(info.notes)
    return (f"eager PyTorch fp32 on the checkpoint's weights as loaded ({info.source})"
            + (f": {notes}" if notes else "") + "; greedy over the parity prompt set")


class LlamaDecodeStep(DecodeStepComponent):
    def __init__(self, bundle, context: int, parts="auto", max_part_bytes: int = MAX_PART_BYTES, parity_from: int = 1):
        super().__init__(bundle, context, parts, max_part_bytes, parity_from)
        self.reference_note = f"{reference_note(bundle)}; {SINK_NOTE}"


class LlamaPrefill(PrefillComponent):
    def __init__(self, bundle, context: int, rows: int | None = None, prompt_tokens: int | None = None,
                 simulator_calls: int | None = None, parts="auto", max_part_bytes: int = MAX_PART_BYTES,
                 calibration_chunks: int | None = None):
        """``rows``: default ``prefill_rows(config, context)``; the rest as ``PrefillComponent``."""
        rows = prefill_rows(bundle.config, context) if rows is None else rows
        super().__init__(bundle, context, rows, prompt_tokens, simulator_calls, parts, max_part_bytes,
                         calibration_chunks)
        self.reference_note = reference_note(bundle)

    def feed_chunk(self, caches: dict, tokens: list[int], p0: int):
        """Pad rows repeat the chunk's last token instead of id 0: in trained checkpoints id 0 is often a sink
        token (SmolLM2's ``<|endoftext|>`` drives the residual stream to attention-sink magnitudes), and pad rows'
        activations are part of the calibration set even though no real row attends to them."""
        f = super().feed_chunk(caches, tokens, p0)
        f["embeds"][0, len(tokens):] = self.embedding[tokens[-1]]
        return f


COMPONENTS = {"decode_step": LlamaDecodeStep, "prefill": LlamaPrefill}
