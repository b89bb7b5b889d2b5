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

    def forward(self, *inputs):
        env = dict(zip(self.input_names, inputs))
        x, new = env[self.x_name], []
        for i, layer in zip(range(self.lo, self.hi), self.layers):
            t = TAGS[layer.layer_type]
            x, k, v = layer(x, env[f"cos_{t}"], env[f"sin_{t}"], env[f"mask_{t}"], env[f"k_cache_{i}"], env[f"v_cache_{i}"])
            new += [k, v]
        return (self.lm_head(self.norm(x)) if self.last else x, *new)
