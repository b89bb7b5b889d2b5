"""Hugging Face-style checkpoint directories: config.json + *.safetensors (optionally sharded).

Loading checks every key against the model's expected names and shapes and fails with one line naming what is
missing, unexpected or mis-shaped. Tensors are read one at a time (no whole-file copy) and cast to fp32.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..artifacts.hashing import hash_files
from ..errors import CheckpointError


def _list(names, n=4) -> str:
    names = sorted(names)
    return ", ".join(names[:n]) + (f" (+{len(names) - n} more)" if len(names) > n else "")


def read_config(ckpt: Path) -> dict:
    ckpt = Path(ckpt)
    if not ckpt.is_dir():
        raise CheckpointError(f"checkpoint {ckpt} is not a directory")
    cfg = ckpt / "config.json"
    if not cfg.is_file():
        raise CheckpointError(f"checkpoint {ckpt} has no config.json")
    try:
        return json.loads(cfg.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{cfg} is not valid JSON: {e}") from None


def weight_files(ckpt: Path) -> list[Path]:
    files = sorted(Path(ckpt).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"checkpoint {ckpt} has no *.safetensors files")
    return files


def load_state_dict(ckpt: Path, expected: dict[str, tuple[int, ...]], ignore_prefixes: tuple[str, ...] = (),
                    optional: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """Read every expected tensor from the checkpoint; refuse missing, unexpected or mis-shaped keys."""
    files = weight_files(ckpt)
    where: dict[str, Path] = {}
    for f in files:
        try:
            with safe_open(f, framework="pt") as h:
                for k in h.keys():
                    where[k] = f
        except Exception as e:  # safetensors raises several types for a corrupt header
            raise CheckpointError(f"{f.name} is not a readable safetensors file: {e}") from None
    present = {k for k in where if not k.startswith(ignore_prefixes)}
    missing = set(expected) - present - set(optional)
    unexpected = present - set(expected)
    if missing:
        raise CheckpointError(f"checkpoint {Path(ckpt).name}: missing keys: {_list(missing)}")
    if unexpected:
        raise CheckpointError(f"checkpoint {Path(ckpt).name}: unexpected keys: {_list(unexpected)}")
    out = {}
    for k in sorted(set(expected) & present):
        try:
            with safe_open(where[k], framework="pt") as h:
                t = h.get_tensor(k)
        except Exception as e:
            raise CheckpointError(f"{where[k].name}: cannot read tensor {k}: {e}") from None
        if tuple(t.shape) != tuple(expected[k]):
            raise CheckpointError(f"checkpoint {Path(ckpt).name}: key {k} has shape {tuple(t.shape)}, "
                                  f"expected {tuple(expected[k])}")
        if not torch.is_floating_point(t):
            raise CheckpointError(f"checkpoint {Path(ckpt).name}: key {k} has dtype {t.dtype}, expected floating point")
        out[k] = t.float()
    return out


def checkpoint_hash(ckpt: Path) -> str:
    return hash_files({f.name: f for f in weight_files(ckpt)})


def save_checkpoint(state: dict[str, torch.Tensor], config: dict, ckpt: Path) -> None:
    """Write config.json + model.safetensors (used by tests and ``omni-export checkpoint``)."""
    from ..artifacts.store import atomic_dir

    with atomic_dir(Path(ckpt)) as tmp:
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file({k: v.detach().contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"))
