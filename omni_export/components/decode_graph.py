"""The decode step's graph module (``DecodeStep``): one row (AR-1) or N rows (the prefill's AR-N) through layers
``lo..hi-1`` over static caches. ``decoder_lm`` drives it (IO spec, host loop); ``decoder_prefill`` feeds it N rows."""
from __future__ import annotations

import torch.nn as nn

from ..blocks.layers import FULL, SLIDING

TAGS = {FULL: "full", SLIDING: "sliding"}  # layer type -> the suffix of its tables' and mask's input names


class DecodeStep(nn.Module):
    """AR-1 decode step over static caches, for layers ``lo..hi-1`` (all layers by default).

    Inputs, by name (``input_names``): ``embeds`` [1,1,H] (gathered on the host) for the first part, else
    ``hidden_{lo}``; ``cos_full``/``sin_full`` [1,1,1,rot_full] and ``cos_sliding``/``sin_sliding`` [1,1,1,rot_sliding]
    (host RoPE tables, fp32); ``mask_full`` [1,1,1,C+1] and ``mask_sliding`` [1,1,1,W] (additive); per layer
    ``k_cache_i``/``v_cache_i`` [1,nkv,C,hd] (full) or [1,nkv,W-1,hd] (sliding ring buffer). Only the tables and
    masks of layer types present are inputs. Outputs: ``logits`` [1,1,V] for the last part (final norm + LM head),
    else ``hidden_{hi}``; then ``k_new_i``/``v_new_i`` [1,nkv,1,hd] per layer. The same module takes N rows (the
    prefill's graph: ``decoder_prefill``).
    """

    def __init__(self, lm, context: int, lo: int = 0, hi: int | None = None):
        super().__init__()
        self.cfg, self.context = lm.config, context
        self.lo, self.hi = lo, lm.config.num_hidden_layers if hi is None else hi
        self.last = self.hi == lm.config.num_hidden_layers
        self.layers = nn.ModuleList(lm.model.layers[self.lo:self.hi])
        self.norm, self.lm_head = (lm.model.norm, lm.lm_head) if self.last else (None, None)
        tags = [t for lt, t in TAGS.items() if any(l.layer_type == lt for l in self.layers)]
        self.x_name = "embeds" if lo == 0 else f"hidden_{lo}"
        self.input_names = ([self.x_name] + [f"{f}_{t}" for t in tags for f in ("cos", "sin")] +
                            [f"mask_{t}" for t in tags] +
                            [f"{kv}_cache_{i}" for i in range(self.lo, self.hi) for kv in ("k", "v")])
        self.output_names = (["logits" if self.last else f"hidden_{self.hi}"] +
                             [f"{kv}_new_{i}" for i in range(self.lo, self.hi) for kv in ("k", "v")])

    def cache_len(self, layer_type: str) -> int:
        return self.context if layer_type == FULL else self.cfg.sliding_window - 1

    def body(self, *inputs):
        """The layers: the last layer's output (before the final norm) and the new K/V rows."""
        env = dict(zip(self.input_names, inputs))
        x, new = env[self.x_name], []
        for i, layer in zip(range(self.lo, self.hi), self.layers):
            t = TAGS[layer.layer_type]
            x, k, v = layer(x, env[f"cos_{t}"], env[f"sin_{t}"], env[f"mask_{t}"], env[f"k_cache_{i}"], env[f"v_cache_{i}"])
            new += [k, v]
        return x, new

    def forward(self, *inputs):
        x, new = self.body(*inputs)
        return (self.lm_head(self.norm(x)) if self.last else x, *new)


HEAD_ROWS = "head_rows"


class HeadOnRows(nn.Module):
    """A whole ``DecodeStep`` whose final norm and LM head run only on the rows its last input ``head_rows`` (int64
    [n]) names; every other row's logits are zeros. For fp32 host loops that read a row's logits only to choose its
    next token (``DecodeStepComponent.batched_steps``): on a large vocabulary the head is most of a step (Gemma 3's
    262,144 x 640 was 18 of the 39 s its calibration pass took on one core). Not an exported graph."""

    def __init__(self, step: DecodeStep):
        super().__init__()
        if not step.last:
            raise ValueError("HeadOnRows takes the whole decode step (its last part holds the head)")
        self.step = step

    def forward(self, *inputs):
        *inputs, rows = inputs
        x, new = self.step.body(*inputs)
        logits = x.new_zeros((*x.shape[:-1], self.step.cfg.vocab_size))
        if rows.numel():
            logits[rows] = self.step.lm_head(self.step.norm(x[rows]))
        return (logits, *new)
