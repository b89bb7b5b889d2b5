"""Model families, in one explicit registry: ``FAMILIES`` names the folders shipped here (``families/<name>/``, each
exposing ``FAMILY``); ``register_family`` adds one from any importable package. A family folder holds its
``nn.Module`` s, its components (graphs, IO spec, host driver), the per-target graph forms its layers need (handed to
the targets through ``Component.graph_for``), its prompt sets (``prompts/*.txt``), its tokenizer hookup and its
checkpoint key layout. ``tests/families/test_family_registry.py`` keeps ``FAMILIES`` and the folders in sync."""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn

from ..artifacts.hashing import hash_tensors, hash_value
from ..checkpoints.hf import checkpoint_hash, load_state_dict, locate, read_config, save_hf
from ..checkpoints.mapped import MappedWeights, all_fp32, assign, fp32_bytes, map_checkpoint, seeded_checkpoint
from ..checkpoints.tokenizer import byte_tokenizer, is_byte_tokenizer
from ..components.base import PromptSet
from ..errors import BadInput, CheckpointError, RecipeError

FAMILIES = ("spark", "qwen3_tts", "llama", "minicpmo", "gemma3")  # the family folders shipped here, in ``known`` order

MAP_ABOVE = 2 * 1024**3
# Models whose fp32 weights exceed this are mapped from files instead of held in memory (when the caller gives a
# weights cache for seeded ones): above one part's size, holding the whole model would break the 8 GiB budget.

SEED_MAX = 2**63 - 1  # seeds are torch.Generator seeds: an integer in [0, SEED_MAX]


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
    load_checkpoint: Callable | None = None      # path -> (config, state dict, weights hash[, notes]), own layouts
    save_checkpoint: Callable | None = None      # (bundle, dir) -> None: writes what load_checkpoint reads back
    config_notes: Callable | None = None         # config.json dict -> notes on defaults the config reader applied
    end_to_end: Callable | None = None           # (EndToEndContext, components, results) -> run report dict
    meta_init: bool = False                      # build on the meta device: init_random writes every parameter
    random_tensors: Callable | None = None       # (meta module, seed) -> (name, tensor) pairs, as init_random writes them
    tokenizer: Callable | None = None            # (config, checkpoint dir or None) -> Tokenizer; None: bytes of vocab_size
    prompts: Path | None = None                  # the folder of the family's shipped prompt sets (``<name>.txt``)

    @classmethod
    def declare(cls, name: str, config, model, module_file: str, **kw) -> "Family":
        """The usual family: ``config`` is a dataclass with ``from_hf``/``to_hf``, ``model(config)`` builds the module
        and lists its checkpoint keys (``expected_keys()``), prompt sets in ``prompts/`` beside ``module_file``."""
        kw.setdefault("config_notes", getattr(config, "defaults_taken", None))
        return cls(name=name, config_from_hf=config.from_hf, config_to_hf=config.to_hf, build=model,
                   expected_keys=lambda m: m.expected_keys(), prompts=Path(module_file).parent / "prompts", **kw)

    def make_tokenizer(self, config, checkpoint: Path | None = None):
        if self.tokenizer is not None:
            return self.tokenizer(config, checkpoint)
        return byte_tokenizer(config.vocab_size)

    def write_checkpoint(self, bundle: "ModelBundle", out: Path) -> None:
        """Write ``bundle`` as a checkpoint directory (atomically) in the layout ``build_model(checkpoint=...)`` reads
        for this family: the family's own writer, else config.json + model.safetensors of its expected keys."""
        if self.save_checkpoint is not None:
            return self.save_checkpoint(bundle, Path(out))
        expected = self.expected_keys(bundle.module)
        state = {k: v for k, v in bundle.module.state_dict().items() if k in expected}
        save_hf(state, self.config_to_hf(bundle.config), Path(out))


@dataclass
class ModelBundle:
    family: Family
    module: nn.Module
    config: Any
    source: str            # "seeded random (preset tiny, seed 0)" or "checkpoint <name>"
    config_hash: str
    weights_hash: str
    weights: MappedWeights | None = None  # set when parameters are views of mapped files (full-size models)
    tokenizer: Any = None                 # text -> ids for the components' host loops (checkpoints.Tokenizer interface)
    notes: tuple[str, ...] = ()           # what loading decided that the checkpoint does not say (defaults, tokenizer)

    def release(self) -> None:
        """Hand back the pages of mapped weights this process touched (no-op for in-memory weights); callers that
        work part by part call it between parts, so the resident set stays near one part."""
        if self.weights is not None:
            self.weights.release()

    def provenance(self) -> dict:
        tok = self.tokenizer  # the prompts' ids depend on it: its hash is in every manifest (None: none shipped)
        out = {"family": self.family.name, "source": self.source, "config_hash": self.config_hash,
               "weights_hash": self.weights_hash, "config": self.family.config_to_hf(self.config),
               "tokenizer": {"name": tok.name, "hash": tok.hash} if tok is not None else None}
        if self.notes:
            out["notes"] = list(self.notes)
        return out


_REGISTERED: dict[str, Family] = {}


def register_family(family: Family) -> Family:
    """Add a family defined outside this package (its ``prompts`` folder is searched by ``load_prompt_set``)."""
    if family.name in FAMILIES or family.name in _REGISTERED:
        raise RecipeError(f"model family {family.name!r} is already registered")
    _REGISTERED[family.name] = family
    return family


def unregister_family(name: str) -> None:
    """Remove a family added with ``register_family`` (shipped families stay)."""
    _REGISTERED.pop(name, None)


def known() -> tuple[str, ...]:
    return FAMILIES + tuple(_REGISTERED)


def get_family(name: str) -> Family:
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name not in FAMILIES:
        raise RecipeError(f"unknown model family {name!r}; known: {', '.join(known())}")
    return importlib.import_module(f"{__name__}.{name}").FAMILY


def load_prompt_set(name_or_path: str) -> PromptSet:
    """A shipped set by name (``spark_parity``: ``prompts/spark_parity.txt`` of some family's folder, found without
    importing the family) or a ``.txt`` path: one prompt per line, ``#`` comments."""
    p = Path(name_or_path)
    if p.suffix == ".txt" and p.exists():
        return PromptSet.from_text(p.stem, p.read_text(encoding="utf-8"))
    folders = [Path(__file__).parent / n / "prompts" for n in FAMILIES] + [f.prompts for f in _REGISTERED.values()]
    found = [f for f in folders if f is not None and (f / f"{name_or_path}.txt").is_file()]
    if not found:
        raise BadInput(f"prompt set {name_or_path!r} not found (neither a shipped set nor a .txt file)")
    if len(found) > 1:
        raise BadInput(f"prompt set {name_or_path!r} is shipped by more than one family")
    return PromptSet.from_text(name_or_path, (found[0] / f"{name_or_path}.txt").read_text(encoding="utf-8"))


def check_seed(seed) -> int:
    """A seed for seeded weights: an integer in [0, SEED_MAX] (one-line error otherwise)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        shown = str(seed) if len(str(seed)) <= 24 else f"{str(seed)[:12]}... ({len(str(seed))} digits)"
        raise BadInput(f"seed {shown} is out of range (an integer from 0 to 2**63-1)")
    return seed


def build_model(family: str, preset: str | None = None, seed: int = 0, checkpoint: Path | None = None,
                weights_cache: Path | None = None) -> ModelBundle:
    """``weights_cache``: where a large seeded model is written once as an fp32 checkpoint and mapped from (see
    ``MAP_ABOVE``); without it, or for small models, weights are in memory. A checkpoint is read through the checked
    reader (``checkpoints.hf``, or the family's own ``load_checkpoint`` built on it): its layout is refused before
    any model is built."""
    fam = get_family(family)
    if checkpoint is None:
        check_seed(seed)
        if preset not in fam.presets:
            raise RecipeError(f"unknown preset {preset!r} for {family}; known: {', '.join(fam.presets)}")
    if checkpoint is not None and fam.load_checkpoint is None:
        locate(Path(checkpoint))  # a stale shard, a key in two files, ...: refused from the headers, first
    mapped = _mapped(fam, preset, seed, checkpoint, weights_cache)
    if mapped is not None:
        return mapped
    notes: tuple[str, ...] = ()
    if checkpoint is not None and fam.load_checkpoint is not None:
        cfg, state, whash, *rest = fam.load_checkpoint(Path(checkpoint))
        notes = tuple(rest[0]) if rest else ()
        module = fam.build(cfg)
        module.load_state_dict(state, strict=False)
        source = f"checkpoint {Path(checkpoint).name}"
    elif checkpoint is not None:
        cfg, notes = _config_of(fam, Path(checkpoint))
        module = fam.build(cfg)
        state = load_state_dict(Path(checkpoint), fam.expected_keys(module))  # keys checked before tensors are read
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
    return _bundle(fam, module, cfg, source, whash, checkpoint=checkpoint, notes=notes)


def _finite(t: torch.Tensor) -> bool:
    """Every element finite. A finite sum proves it (a NaN or an infinity anywhere makes the sum non-finite) at a
    twentieth of ``isfinite(t).all()``'s cost; only a non-finite sum (or an overflowing one) is checked element-wise."""
    return bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all())


def _bundle(fam, module, cfg, source, whash, weights=None, checkpoint=None, notes=()) -> ModelBundle:
    module.eval()
    for name, p in module.named_parameters():
        p.requires_grad_(False)
        if checkpoint is not None and not _finite(p):  # named here, not at calibration
            raise CheckpointError(f"checkpoint {checkpoint}: tensor {name} contains NaN or inf")
    if checkpoint is not None and weights is not None:
        weights.release()  # the finiteness pass touched every mapped page
    tok = fam.make_tokenizer(cfg, Path(checkpoint) if checkpoint is not None else None)
    if checkpoint is not None and is_byte_tokenizer(tok):
        notes = tuple(notes) + (_byte_tokenizer_note(fam, Path(checkpoint), tok),)
    return ModelBundle(fam, module, cfg, source, hash_value(fam.config_to_hf(cfg)), whash, weights, tok, tuple(notes))


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def _byte_tokenizer_note(fam, checkpoint: Path, tok) -> str:
    """Why a checkpoint's prompts are byte-encoded (recorded in the provenance: the ids are not the model's own)."""
    if checkpoint.is_dir():
        have = [n for n in TOKENIZER_FILES if (checkpoint / n).is_file()]
        why = (f"the {fam.name} family does not read its {have[0]}" if have else "the checkpoint has no tokenizer")
    else:
        why = "the checkpoint embeds no tokenizer"
    return f"prompts are encoded with the byte tokenizer ({tok.name}, vocab {tok.vocab_size}): {why}"


def _config_of(fam, checkpoint: Path):
    """(config, notes) from a checkpoint's config.json; a one-line error names the checkpoint."""
    try:
        raw = read_config(checkpoint)
        notes = tuple(fam.config_notes(raw)) if fam.config_notes is not None else ()
        return fam.config_from_hf(raw), notes
    except CheckpointError as err:
        raise CheckpointError(f"checkpoint {checkpoint}: {err}") from None


def _mapped(fam, preset, seed, checkpoint, weights_cache) -> ModelBundle | None:
    """The mapped path: a large model of a meta-init family, from a fp32 checkpoint or a seeded one written once."""
    if not fam.meta_init:
        return None
    cfg, notes = _config_of(fam, Path(checkpoint)) if checkpoint is not None else (fam.presets[preset], ())
    with torch.device("meta"):
        module = fam.build(cfg)
    if fp32_bytes(module) <= MAP_ABOVE:
        return None
    if checkpoint is not None:
        if not all_fp32(Path(checkpoint)):  # e.g. a bf16 release: the in-memory path reads and casts it
            return None
        weights = map_checkpoint(Path(checkpoint))  # exactly the files the checked layout names
        whash, source = checkpoint_hash(Path(checkpoint)), f"checkpoint {Path(checkpoint).name} (mapped)"
    else:
        if weights_cache is None or fam.random_tensors is None:
            return None
        cfg_hash = hash_value(fam.config_to_hf(cfg))
        d = Path(weights_cache) / f"{fam.name}-{preset}-seed{seed}-{cfg_hash[:12]}"
        if not d.is_dir():  # written atomically (with its hash) once, then mapped by every later run
            seeded_checkpoint(d, fam.random_tensors(module, seed), fam.config_to_hf(cfg))
        weights = map_checkpoint(d)
        whash, source = (d / "weights_hash").read_text().strip(), f"seeded random (preset {preset}, seed {seed}; mapped)"
    assign(module, weights, fam.expected_keys(module))
    return _bundle(fam, module, cfg, source, whash, weights, checkpoint, notes)
