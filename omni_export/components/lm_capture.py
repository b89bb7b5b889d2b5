"""A decode step's calibration capture, recorded from the batched fp32 pass that measures the attention sinks.

The capture needs the sink plan first (which positions are samples), and the plan needs a pass over every
calibration position; both passes run the same batched eager steps on the same inputs. So the plan's pass also
records what the capture stores for every position (the small inputs, each KV cache input as ``Rows`` into the
per-sequence pool of rows the steps wrote), and the capture then keeps the planned positions from that record
instead of running the fp32 model again: one pass instead of two, the same samples (a record and a second pass
write the same set: ``tests/families/llama/test_llama_sinks.py``). The record is small: a decode step's inputs
without its caches, and the K/V rows a capture's pools hold anyway.
"""
from __future__ import annotations

import numpy as np

from .base import Rows


class CaptureRecord:
    """Called with every batched step ``(pos, active rows, feed, outputs)`` before the step's rows are written;
    ``feeds[(b, pos)]`` is row ``b``'s sample at ``pos`` with its caches as ``Rows``, ``pools()`` the row pools."""

    def __init__(self, comp, n_seqs: int):
        self.comp, self.types = comp, comp.cfg.layer_types
        self.slots = [{lt: np.full(comp.cache_len(lt), -1, np.int64) for lt in set(self.types)} for _ in range(n_seqs)]
        self.rows: list[dict[str, list[np.ndarray]]] = [{} for _ in range(n_seqs)]
        self.feeds: dict[tuple[int, int], dict] = {}

    def __call__(self, pos: int, active, f: dict, o) -> None:
        for b in active:
            feed = {k: v[b:b + 1].copy() if k == "embeds" else v.copy() for k, v in f.items() if "_cache_" not in k}
            for i, lt in enumerate(self.types):
                for kv in "kv":
                    feed[f"{kv}_cache_{i}"] = Rows(f"s{b:03d}_{kv}{i}", self.slots[b][lt].copy(), axis=2)
            self.feeds[(b, pos)] = feed
        for b in active:  # the rows this step writes, as ``write`` places them
            for i in range(len(self.types)):
                for j, kv in enumerate("kv"):
                    self.rows[b].setdefault(f"{kv}{i}", []).append(o[1 + j + 2 * i][b:b + 1])
            for lt in self.slots[b]:
                self.slots[b][lt][self.comp.slot(lt, pos)] = pos

    def pools(self) -> dict[str, np.ndarray]:
        return {f"s{b:03d}_{name}": np.concatenate(parts, axis=2)
                for b, r in enumerate(self.rows) for name, parts in r.items()}
