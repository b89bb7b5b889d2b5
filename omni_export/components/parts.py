"""How a decoder LM's layers split into parts: each part is one graph, exported, quantized and compiled on its own,
so the largest model's peak memory is one part's (``DecodeStepComponent``'s ``parts`` option)."""
from __future__ import annotations

import numpy as np
import torch.nn as nn


MAX_PART_BYTES = 2 * 1024**3
# Each part's weights in fp32 stay under 2 GiB: the HTP context a part compiles to is then at most 1 GiB in fp16
# and ~0.5 GiB in w8a16, well inside the ~2 GB a single QNN context may map on Snapdragon 8 Gen 3 / 8 Elite, and
# exporting + quantizing one part at a time keeps the peak memory of a full-size run within a laptop's 8 GiB.


def _fp32_bytes(module: nn.Module) -> int:
    return 4 * sum(p.numel() for p in module.parameters())


def plan_parts(lm, parts="auto", max_part_bytes: int = MAX_PART_BYTES) -> list[tuple[int, int]]:
    """Split ``lm``'s layers into contiguous parts: ``parts`` equal parts, or (``auto``) as few as keep each part's fp32
    weights (counted from the module's parameters, a meta-device module too; the last part includes the final norm
    and LM head) under ``max_part_bytes``."""
    n = lm.config.num_hidden_layers
    if parts != "auto":
        parts = int(parts)
        if not 1 <= parts <= n:
            raise ValueError(f"parts must be between 1 and {n}, got {parts}")
        bounds = [round(i * n / parts) for i in range(parts + 1)]
        return list(zip(bounds[:-1], bounds[1:]))
    sizes = [_fp32_bytes(layer) for layer in lm.model.layers]
    sizes[-1] += _fp32_bytes(lm.model.norm) + _fp32_bytes(lm.lm_head)
    if max(sizes) > max_part_bytes:
        raise ValueError(f"one layer plus the LM head ({max(sizes) / 2**30:.2f} GiB) exceeds the part limit")
    cum = np.cumsum([0] + sizes)
    for k in range(1, n + 1):  # fewest parts, cut where the cumulative size crosses j/k of the total
        cuts = [0] + [int(np.argmin(np.abs(cum - j * cum[-1] / k))) for j in range(1, k)] + [n]
        if len(set(cuts)) == k + 1 and all(cum[b] - cum[a] <= max_part_bytes for a, b in zip(cuts, cuts[1:])):
            return list(zip(cuts[:-1], cuts[1:]))
    raise ValueError("no split of the layers fits the part limit")
