"""Model families. Each family module exposes ``FAMILY`` (a ``Family``); adding a model is one module plus one
line in ``FAMILIES``."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn

from ..artifacts.hashing import hash_tensors, hash_value
from ..errors import RecipeError
from .checkpoint import checkpoint_hash, load_state_dict, read_config


@dataclass(frozen=True)
class Family:
    name: str
    presets: dict[str, Any]                      # preset name -> config dataclass
    config_from_hf: Callable[[dict], Any]
    config_to_hf: Callable[[Any], dict]
    build: Callable[[Any], nn.Module]            # config -> fp32 module (uninitialised weights)
    init_random: Callable[[nn.Module, int], nn.Module]
    expected_keys: Callable[[nn.Module], dict]   # checkpoint key -> shape
    components: dict[str, Callable] = field(default_factory=dict)  # component name -> factory(bundle, **opts)
    load_checkpoint: Callable | None = None      # dir -> (config, state dict, weights hash), for multi-file layouts
    end_to_end: Callable | None = None           # (pipeline, components, results) -> dict for the run report
    meta_init: bool = False                      # build on the meta device: init_random writes every parameter


@dataclass
class ModelBundle:
    family: Family
    module: nn.Module
    config: Any
    source: str            # "seeded random (preset tiny, seed 0)" or "checkpoint <name>"
    config_hash: str
    weights_hash: str

    def provenance(self) -> dict:
        return {"family": self.family.name, "source": self.source, "config_hash": self.config_hash,
                "weights_hash": self.weights_hash, "config": self.family.config_to_hf(self.config)}


def get_family(name: str) -> Family:
    from . import qwen3_tts, spark
    families = {f.name: f for f in (spark.FAMILY, qwen3_tts.FAMILY)}
    if name not in families:
        raise RecipeError(f"unknown model family {name!r}; known: {', '.join(families)}")
    return families[name]


def build_model(family: str, preset: str | None = None, seed: int = 0, checkpoint: Path | None = None) -> ModelBundle:
    fam = get_family(family)
    if checkpoint is not None and fam.load_checkpoint is not None:
        cfg, state, whash = fam.load_checkpoint(Path(checkpoint))
        module = fam.build(cfg)
        module.load_state_dict(state, strict=False)
        source = f"checkpoint {Path(checkpoint).name}"
    elif checkpoint is not None:
        cfg = fam.config_from_hf(read_config(Path(checkpoint)))
        module = fam.build(cfg)
        state = load_state_dict(Path(checkpoint), fam.expected_keys(module))
        module.load_state_dict(state, strict=False)
        source, whash = f"checkpoint {Path(checkpoint).name}", checkpoint_hash(Path(checkpoint))
    else:
        if preset not in fam.presets:
            raise RecipeError(f"unknown preset {preset!r} for {family}; known: {', '.join(fam.presets)}")
        cfg = fam.presets[preset]
        if fam.meta_init:  # skip torch's default init: init_random writes every parameter (saves a minute at 1.7B)
            with torch.device("meta"):
                module = fam.build(cfg)
            module = module.to_empty(device="cpu")
        else:
            module = fam.build(cfg)
        module = fam.init_random(module, seed)
        source = f"seeded random (preset {preset}, seed {seed})"
        whash = hash_tensors(module.state_dict())
    module.eval()
    for p in module.parameters():
        p.requires_grad_(False)
    return ModelBundle(fam, module, cfg, source, hash_value(fam.config_to_hf(cfg)), whash)
