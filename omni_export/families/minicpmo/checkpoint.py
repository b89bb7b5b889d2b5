"""The official key layouts: the TTS head's ``tts.``-prefixed keys (``head_code.0`` weight-normed), ``flow.pt``
(our ``flow`` names exactly) and HiFT's (``hift.pt`` without its ``generator.`` prefix, as ``stepaudio2``'s
``Token2wav`` loads it into the original ``HiFTGenerator``; every conv but ``source_downs`` weight-normed, as are
the F0 predictor's). Weight norm is folded on load: W = g * v / ||v|| over all dims but 0 (``torch.nn.utils.parametrizations.weight_norm``'s default dim 0).

``split_state`` / ``official_state`` convert between our state dict and the three official ones (a round trip gives
the same tensors bit for bit); anything missing, unexpected or mis-shaped is a one-line ``CheckpointError``.
``release_layout.save_release`` writes the released directory layout.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ...errors import CheckpointError

G, V = ".parametrizations.weight.original0", ".parametrizations.weight.original1"
PARTS = ("tts", "flow", "hift")


def weight_normed(model: nn.Module) -> set[str]:
    """Our parameter names (``<part>.<path>.weight``) whose official key is a weight-norm pair."""
    out = {"tts.head_code.0.weight"}
    for name, mod in model.hift.named_modules():
        if isinstance(mod, (nn.Conv1d, nn.ConvTranspose1d)) and not name.startswith("source_downs"):
            out.add(f"hift.{name}.weight")
    return out


def _norm(v: torch.Tensor) -> torch.Tensor:
    return v.reshape(v.shape[0], -1).norm(dim=1).reshape((-1,) + (1,) * (v.ndim - 1))


def official_state(model: nn.Module) -> dict[str, dict[str, torch.Tensor]]:
    """Our weights in the official layouts: {"tts": {"tts.<key>": ...}, "flow": {...}, "hift": {...}}."""
    wn, out = weight_normed(model), {p: {} for p in PARTS}
    for k, t in model.state_dict().items():
        part, rest = k.split(".", 1)
        key = f"tts.{rest}" if part == "tts" else rest
        if k in wn:
            base = key[: -len(".weight")]
            out[part][base + G], out[part][base + V] = _norm(t).clone(), t.clone()
        else:
            out[part][key] = t.clone()
    return out


def split_state(model: nn.Module, official: dict[str, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The three official state dicts -> our state dict (weight norm folded), every key checked."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    wn, state = weight_normed(model), {}
    for part in PARTS:
        if part not in official:
            raise CheckpointError(f"minicpmo checkpoint: the {part} weights are missing")
        got = dict(official[part])
        for k in [k for k in expected if k.startswith(part + ".")]:
            rest = k.split(".", 1)[1]
            key = f"tts.{rest}" if part == "tts" else rest
            if k in wn:
                base = key[: -len(".weight")]
                if base + G not in got or base + V not in got:
                    raise CheckpointError(f"minicpmo {part} checkpoint: missing key {base + V}")
                g, v = got.pop(base + G), got.pop(base + V)
                t = v * (g / _norm(v))  # g * v / |v|; exactly v when g is |v| as ``official_state`` writes it
            elif key not in got:
                raise CheckpointError(f"minicpmo {part} checkpoint: missing key {key}")
            else:
                t = got.pop(key)
            if tuple(t.shape) != expected[k]:
                raise CheckpointError(f"minicpmo {part} checkpoint: key {key} has shape {tuple(t.shape)}, "
                                      f"expected {expected[k]}")
            state[k] = t.float()
        unused = [k for k in got if not k.startswith("tts.projector_spk.")]   # unused at inference upstream
        if unused:
            raise CheckpointError(f"minicpmo {part} checkpoint: unexpected keys: {', '.join(sorted(unused)[:4])}")
    return state

