"""Train a tiny Spark-X2.5-architecture model on text available offline, so quantization is measured on trained
statistics (activation outliers, uneven weight ranges) and not only on random weights.

Text: the Python standard library's own ``.py`` sources (``sysconfig.get_paths()["stdlib"]``), byte-tokenized with the
tokenizer every recipe uses. One CPU thread, a wall-clock budget (default 3 minutes). The checkpoint (config.json +
model.safetensors, < 5 MB) is what ``tests/data/tiny_spark_trained`` ships::

    python benchmarks/train_tiny_spark.py tests/data/tiny_spark_trained --minutes 3
    omni-export sweep spark_sweep --checkpoint tests/data/tiny_spark_trained --store "$(mktemp -d)"
"""
from __future__ import annotations

import argparse
import math
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from omni_export.checkpoints.tokenizer import byte_tokenizer
from omni_export.checkpoints.hf import save_hf
from omni_export.families.spark.model import FULL, SparkConfig, SparkForCausalLM, init_random
from omni_export.blocks.layers import rope_table

CONFIG = SparkConfig(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=32, sliding_window=16, vocab_size=384,
                     max_position_embeddings=512)


def corpus(max_bytes: int) -> np.ndarray:
    """Token ids of the standard library's .py sources, in sorted file order, up to ``max_bytes`` bytes."""
    root = Path(sysconfig.get_paths()["stdlib"])
    tok = byte_tokenizer(CONFIG.vocab_size)
    ids, n = [], 0
    for p in sorted(root.glob("*.py")):
        text = p.read_text(encoding="utf-8", errors="ignore")
        ids.append(np.asarray(tok.encode(text), np.int64))
        n += len(ids[-1])
        if n >= max_bytes:
            break
    return np.concatenate(ids)


def forward(lm: SparkForCausalLM, tokens: torch.Tensor, tables: dict, masks: dict) -> torch.Tensor:
    """Whole-sequence causal forward (sliding layers see their window), the same layers the decode step exports."""
    cfg = lm.config
    B, S = tokens.shape
    x = lm.model.embedding(tokens)
    empty = torch.zeros(B, cfg.num_key_value_heads, 0, cfg.head_dim)
    for layer in lm.model.layers:
        cos, sin = tables[layer.layer_type]
        x, _, _ = layer(x, cos, sin, masks[layer.layer_type], empty, empty)
    return lm.lm_head(lm.model.norm(x))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    data = corpus(4_000_000)
    held = data[-50_000:]
    data = data[:-50_000]
    lm = init_random(SparkForCausalLM(CONFIG), a.seed).train()
    pos = np.arange(a.seq)
    i, j = np.meshgrid(pos, pos, indexing="ij")
    tables, masks = {}, {}
    for lt in set(CONFIG.layer_types):
        tables[lt] = tuple(torch.from_numpy(t)[None, None] for t in rope_table(CONFIG.inv_freq(lt), pos))
        ok = (j <= i) & ((lt == FULL) | (j > i - CONFIG.sliding_window))
        masks[lt] = torch.from_numpy(np.where(ok, 0.0, -100.0).astype(np.float32))[None, None]
    opt = torch.optim.AdamW(lm.parameters(), lr=a.lr, weight_decay=0.01)
    rs = np.random.RandomState(a.seed)
    t0, step, budget = time.perf_counter(), 0, a.minutes * 60

    def batch(src):
        starts = rs.randint(0, len(src) - a.seq - 1, a.batch)
        b = torch.from_numpy(np.stack([src[s: s + a.seq + 1] for s in starts]))
        return b[:, :-1], b[:, 1:]

    while time.perf_counter() - t0 < budget:
        frac = (time.perf_counter() - t0) / budget
        for g in opt.param_groups:  # cosine decay over the wall-clock budget
            g["lr"] = a.lr * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))
        x, y = batch(data)
        loss = F.cross_entropy(forward(lm, x, tables, masks).reshape(-1, CONFIG.vocab_size), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 50 == 0:
            print(f"step {step} {time.perf_counter() - t0:.0f}s loss {loss.item():.3f}", flush=True)
    lm.eval()
    with torch.no_grad():
        x, y = batch(held)
        val = F.cross_entropy(forward(lm, x, tables, masks).reshape(-1, CONFIG.vocab_size), y.reshape(-1)).item()
    print(f"{step} steps in {time.perf_counter() - t0:.0f} s; held-out loss {val:.3f} nats/byte "
          f"({val / math.log(2):.2f} bits/byte; uniform over bytes is 8)")
    state = {k: v for k, v in lm.state_dict().items() if k in lm.expected_keys()}
    save_hf(state, CONFIG.to_hf(), a.out)
    size = sum(p.stat().st_size for p in a.out.iterdir())
    print(f"wrote {a.out} ({size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
