"""Model families. Each family module exposes ``FAMILY`` (a ``Family``); adding a model is one module plus one
line in ``FAMILIES``."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn

from ..artifacts.hashing import hash_tensors, hash_value
from ..errors import CheckpointError, RecipeError
from .checkpoint import checkpoint_hash, load_state_dict, read_config, weight_files
from .mapped import MappedWeights, assign, fp32_bytes, seeded_checkpoint

MAP_ABOVE = 2 * 1024**3
# Models whose fp32 weights exceed this are mapped from files instead of held in memory (when the caller gives a
# weights cache for seeded ones): above one part's size, holding the whole model would break the 8 GiB budget.


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
    random_tensors: Callable | None = None       # (meta module, seed) -> (name, tensor) pairs, as init_random writes them


@dataclass
class ModelBundle:
    family: Family
    module: nn.Module
    config: Any
    source: str            # "seeded random (preset tiny, seed 0)" or "checkpoint <name>"
    config_hash: str
    weights_hash: str
    weights: MappedWeights | None = None  # set when parameters are views of mapped files (full-size models)

    def release(self) -> None:
        """Hand back the pages of mapped weights this process touched (no-op for in-memory weights); callers that
        work part by part call it between parts, so the resident set stays near one part."""
        if self.weights is not None:
            self.weights.release()

    def provenance(self) -> dict:
        return {"family": self.family.name, "source": self.source, "config_hash": self.config_hash,
                "weights_hash": self.weights_hash, "config": self.family.config_to_hf(self.config)}


def get_family(name: str) -> Family:
    from . import qwen3_tts, spark
    families = {f.name: f for f in (spark.FAMILY, qwen3_tts.FAMILY)}
    if name not in families:
        raise RecipeError(f"unknown model family {name!r}; known: {', '.join(families)}")
    return families[name]


def build_model(family: str, preset: str | None = None, seed: int = 0, checkpoint: Path | None = None,
                weights_cache: Path | None = None) -> ModelBundle:
    """``weights_cache``: where a large seeded model is written once as an fp32 checkpoint and mapped from (see
    ``MAP_ABOVE``); without it, or for small models, weights are in memory."""
    fam = get_family(family)
    if checkpoint is None and preset not in fam.presets:
        raise RecipeError(f"unknown preset {preset!r} for {family}; known: {', '.join(fam.presets)}")
    mapped = _mapped(fam, preset, seed, checkpoint, weights_cache)
    if mapped is not None:
        return mapped
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
    return _bundle(fam, module, cfg, source, whash)


def _bundle(fam, module, cfg, source, whash, weights=None) -> ModelBundle:
    module.eval()
    for p in module.parameters():
        p.requires_grad_(False)
    return ModelBundle(fam, module, cfg, source, hash_value(fam.config_to_hf(cfg)), whash, weights)


def _mapped(fam, preset, seed, checkpoint, weights_cache) -> ModelBundle | None:
    """The mapped path: a large model of a meta-init family, from a fp32 checkpoint or a seeded one written once."""
    if not fam.meta_init:
        return None
    cfg = fam.config_from_hf(read_config(Path(checkpoint))) if checkpoint is not None else fam.presets[preset]
    with torch.device("meta"):
        module = fam.build(cfg)
    if fp32_bytes(module) <= MAP_ABOVE:
        return None
    if checkpoint is not None:
        files = weight_files(Path(checkpoint))
        try:
            weights = MappedWeights(files)
        except CheckpointError:  # not all fp32 (e.g. a bf16 release): the in-memory path reads and casts it
            return None
        whash, source = checkpoint_hash(Path(checkpoint)), f"checkpoint {Path(checkpoint).name} (mapped)"
    else:
        if weights_cache is None or fam.random_tensors is None:
            return None
        cfg_hash = hash_value(fam.config_to_hf(cfg))
        d = Path(weights_cache) / f"{fam.name}-{preset}-seed{seed}-{cfg_hash[:12]}"
        if not d.is_dir():  # written atomically (with its hash) once, then mapped by every later run
            seeded_checkpoint(d, fam.random_tensors(module, seed), fam.config_to_hf(cfg))
        weights = MappedWeights(weight_files(d))
        whash, source = (d / "weights_hash").read_text().strip(), f"seeded random (preset {preset}, seed {seed}; mapped)"
    assign(module, weights, fam.expected_keys(module))
    return _bundle(fam, module, cfg, source, whash, weights)
