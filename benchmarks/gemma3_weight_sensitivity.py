"""Which Gemma 3 270M projections need 16-bit weights: eager fp32 with one group of projection weights rounded to
int8 (or int16) symmetric per output channel (min-max scales), activations float, against the plain eager model.

Weight-only and eager (no ONNX, no activation quantization), so it separates the weights' share of a w8a16 build's
error from the activations'. Teacher-forced over the parity prompts (``gemma3_parity``) each followed by fp32's own
greedy continuation; figures from position 1 on (row 0 is the prefill's): logits SNR, the weakest K and V rows
(SNR per layer over the positions; K as k_proj outputs, before k_norm and RoPE), KLD mean / p99, top-1. JSON with provenance:

    python benchmarks/gemma3_weight_sensitivity.py --out benchmarks/results/gemma3_weight_sensitivity.json
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from omni_export.artifacts.atomic import write_json_atomic
from omni_export.artifacts.provenance import git_revision, toolchain
from omni_export.families import build_model, load_prompt_set
from omni_export.families.gemma3 import GEMMA3_270M
from omni_export.parity.metrics import snr_db

PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
POLICY_INT16 = ("v_proj", "down_proj")  # components/decoder_qdq.py INT16_WEIGHTS (the head is int16 there too)
ROWS = {  # name -> {projection: bits}; projections not named stay fp32
    **{f"int8 {p} only": {p: 8} for p in PROJ},
    "int8 all projections": {p: 8 for p in PROJ},
    "decoder policy weights (int16 v_proj, down_proj; int8 the rest)": {p: 16 if p in POLICY_INT16 else 8 for p in PROJ},
    "int16 all projections": {p: 16 for p in PROJ},
}


def fake_quant(w: torch.Tensor, bits: int) -> torch.Tensor:
    qmax = 2 ** (bits - 1) - 1
    scale = w.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / qmax
    return torch.round(w / scale).clamp(-qmax, qmax) * scale


def run(lm, seqs, hooks):
    logits, k, v = [], {}, {}
    for ids in seqs:
        hooks.clear()
        with torch.no_grad():
            logits.append(lm(torch.tensor([ids]))[0, 1:].double())
        for name, t in hooks.items():
            (k if name[0] == "k" else v).setdefault(int(name[1:]), []).append(t[0, 1:].double())
    return torch.cat(logits), {i: torch.cat(x) for i, x in k.items()}, {i: torch.cat(x) for i, x in v.items()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    torch.set_grad_enabled(False)
    g = build_model("gemma3", checkpoint=GEMMA3_270M)
    lm, tok = g.module, g.tokenizer
    layers = lm.model.layers
    hooks: dict[str, torch.Tensor] = {}
    for i, layer in enumerate(layers):
        for kv in ("k", "v"):
            getattr(layer.self_attn, f"{kv}_proj").register_forward_hook(
                lambda m, inp, out, name=f"{kv}{i}": hooks.__setitem__(name, out.detach()))
    seqs = []
    for p in load_prompt_set("gemma3_parity").prompts:
        ids = tok.encode(p, 64)
        for _ in range(a.new_tokens):  # fp32's own greedy continuation (full-sequence forward: fine at this length)
            ids = ids + [int(lm(torch.tensor([ids]))[0, -1].argmax())]
        seqs.append(ids)
    ref_logits, ref_k, ref_v = run(lm, seqs, hooks)
    ref_lp = torch.log_softmax(ref_logits, -1)
    originals = {(i, p): getattr(layer.self_attn if p in PROJ[:4] else layer.mlp, p).weight.detach().clone()
                 for i, layer in enumerate(layers) for p in PROJ}
    rows = {}
    for name, bits in ROWS.items():
        for (i, p), w in originals.items():
            mod = getattr(layers[i].self_attn if p in PROJ[:4] else layers[i].mlp, p)
            mod.weight.data.copy_(fake_quant(w, bits[p]) if p in bits else w)
        logits, k, v = run(lm, seqs, hooks)
        lp = torch.log_softmax(logits, -1)
        kld = (ref_lp.exp() * (ref_lp - lp)).sum(-1).numpy()
        ks = {i: snr_db(ref_k[i].numpy(), k[i].numpy()) for i in ref_k}
        vs = {i: snr_db(ref_v[i].numpy(), v[i].numpy()) for i in ref_v}
        kmin, vmin = min(ks, key=ks.get), min(vs, key=vs.get)
        rows[name] = {"weights": bits, "logits_snr_db": round(snr_db(ref_logits.numpy(), logits.numpy()), 2),
                      "min_k_proj_snr_db": [kmin, round(ks[kmin], 2)], "min_v_snr_db": [vmin, round(vs[vmin], 2)],
                      "kld_mean": float(kld.mean()), "kld_p99": float(np.percentile(kld, 99)),
                      "top1_agreement": round(float((logits.argmax(-1) == ref_logits.argmax(-1)).double().mean()), 4)}
        print(name, json.dumps({k_: v_ for k_, v_ in rows[name].items() if k_ != "weights"}), flush=True)
    out = {"benchmark": "gemma3_weight_sensitivity", "command": "python benchmarks/gemma3_weight_sensitivity.py "
           f"--new-tokens {a.new_tokens}", "positions": int(ref_logits.shape[0]),
           "reference": "eager fp32 (plain model, Q4_K_M GGUF dequantized), teacher-forced from position 1",
           "scales": "symmetric per output channel, min-max (no scale search), activations fp32", "rows": rows,
           "wall_s": round(time.monotonic() - t0, 1), "revision": git_revision(), "toolchain": toolchain()}
    if a.out:
        write_json_atomic(a.out, out)


if __name__ == "__main__":
    main()
