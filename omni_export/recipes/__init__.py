"""Recipes: frozen, validated values read from YAML. An unknown key is an error; a name means exactly what it builds.

``load_recipe("spark_w8a16")`` finds a shipped recipe; a path to a ``.yaml`` file works too.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from ..artifacts.hashing import hash_value
from ..errors import RecipeError
from ..parity.gate import Threshold


@dataclass(frozen=True)
class ModelSpec:
    family: str
    preset: str | None = "tiny"
    seed: int = 0
    checkpoint: str | None = None


@dataclass(frozen=True)
class PromptSpec:
    calibration: str
    parity: str
    max_prompt_tokens: int = 16


@dataclass(frozen=True)
class CalibrationSpec:
    max_samples: int = 128
    new_tokens: int = 32


@dataclass(frozen=True)
class ParitySpec:
    new_tokens: int = 32
    simulator_steps: int = 188  # graph calls on the (slow) HTP simulator per artifact
    max_prompts: int | None = None  # parity over the first N prompts of the set (None: all); bounds a full-size run

    def __post_init__(self):
        if self.max_prompts is not None and (not isinstance(self.max_prompts, int) or self.max_prompts < 1):
            raise RecipeError(f"parity.max_prompts must be a positive integer, got {self.max_prompts!r}")


@dataclass(frozen=True)
class Build:
    target: str
    scheme: str
    components: tuple[str, ...] | None = None  # default: every component of the recipe


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    model: ModelSpec
    components: tuple[str, ...]
    context: int
    device: str
    prompts: PromptSpec
    builds: tuple[Build, ...]
    thresholds: dict = field(default_factory=dict)   # "scheme" or "component/scheme" -> tuple[Threshold, ...]
    calibration: CalibrationSpec = CalibrationSpec()
    parity: ParitySpec = ParitySpec()
    expect_blocked: bool = False  # a recipe of known-broken schemes: documents that the gate must block it
    options: dict = field(default_factory=dict)  # component name -> keyword options of its factory (e.g. parts)
    presets: dict = field(default_factory=dict)  # preset name -> overrides of context/calibration/parity/options

    def thresholds_for(self, component: str, scheme: str) -> tuple[Threshold, ...]:
        """Component-specific thresholds (``component/scheme``) take precedence over the scheme's."""
        return self.thresholds.get(f"{component}/{scheme}", self.thresholds.get(scheme, ()))

    def jobs(self) -> list[tuple[str, "Build"]]:
        """(component, build) pairs in recipe order."""
        return [(c, b) for b in self.builds for c in (b.components or self.components)]

    @property
    def hash(self) -> str:
        return hash_value(self.to_dict())

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["thresholds"] = {k: [t.to_dict() for t in v] for k, v in self.thresholds.items()}
        return d

    def with_overrides(self, **kw) -> "Recipe":
        """CLI overrides: preset, seed, checkpoint, context, device, simulator_steps."""
        r = self
        model = {k: kw.pop(k) for k in ("preset", "seed", "checkpoint") if kw.get(k) is not None}
        if model:
            if "checkpoint" in model:
                model["preset"] = None
            r = dataclasses.replace(r, model=dataclasses.replace(r.model, **model))
        ov = r.presets.get(r.model.preset) if r.model.preset else None
        if ov:
            r = dataclasses.replace(
                r, context=ov.get("context", r.context),
                calibration=dataclasses.replace(r.calibration, **ov.get("calibration", {})),
                parity=dataclasses.replace(r.parity, **ov.get("parity", {})),
                options={c: {**r.options.get(c, {}), **ov.get("options", {}).get(c, {})}
                         for c in set(r.options) | set(ov.get("options", {}))})
        if kw.get("simulator_steps") is not None:
            r = dataclasses.replace(r, parity=dataclasses.replace(r.parity, simulator_steps=kw.pop("simulator_steps")))
        if kw.get("parts") is not None:
            parts = kw.pop("parts")
            r = dataclasses.replace(r, options={c: {**r.options.get(c, {}), "parts": parts} for c in r.components})
        kw.pop("parts", None)
        rest = {k: v for k, v in kw.items() if v is not None}
        unknown = set(rest) - {"context", "device"}
        if unknown:
            raise RecipeError(f"unknown override(s): {sorted(unknown)}")
        return dataclasses.replace(r, **rest) if rest else r


def _make(cls, data, where: str):
    if not isinstance(data, dict):
        raise RecipeError(f"{where}: expected a mapping, got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise RecipeError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(names)}")
    required = {f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    missing = required - set(data)
    if missing:
        raise RecipeError(f"{where}: missing key(s) {sorted(missing)}")
    try:
        return cls(**data)
    except TypeError as e:
        raise RecipeError(f"{where}: {e}") from None


def parse_recipe(data: dict, origin: str) -> Recipe:
    if not isinstance(data, dict):
        raise RecipeError(f"recipe {origin}: top level must be a mapping")
    d = dict(data)
    allowed = {f.name for f in dataclasses.fields(Recipe)}
    if set(d) - allowed:
        raise RecipeError(f"recipe {origin}: unknown key(s) {sorted(set(d) - allowed)}; allowed: {sorted(allowed)}")
    try:
        d["model"] = _make(ModelSpec, d.get("model"), f"recipe {origin}: model")
        d["prompts"] = _make(PromptSpec, d.get("prompts"), f"recipe {origin}: prompts")
        if "calibration" in d:
            d["calibration"] = _make(CalibrationSpec, d["calibration"], f"recipe {origin}: calibration")
        if "parity" in d:
            d["parity"] = _make(ParitySpec, d["parity"], f"recipe {origin}: parity")
        builds = d.get("builds")
        if not isinstance(builds, list) or not builds:
            raise RecipeError(f"recipe {origin}: builds must be a non-empty list")
        d["builds"] = tuple(_make(Build, b, f"recipe {origin}: builds[{i}]") for i, b in enumerate(builds))
        d["builds"] = tuple(Build(b.target, b.scheme, tuple(b.components) if b.components else None) for b in d["builds"])
        comps = d.get("components")
        if isinstance(comps, str):
            comps = [comps]
        if not isinstance(comps, list) or not comps or not all(isinstance(c, str) for c in comps):
            raise RecipeError(f"recipe {origin}: components must be a non-empty list of component names")
        d["components"] = tuple(comps)
        th = d.get("thresholds") or {}
        if not isinstance(th, dict):
            raise RecipeError(f"recipe {origin}: thresholds must map scheme -> list")
        d["thresholds"] = {s: tuple(_make(Threshold, t, f"recipe {origin}: thresholds.{s}[{i}]") for i, t in enumerate(lst))
                           for s, lst in th.items()}
        for pname, ov in (d.get("presets") or {}).items():
            bad = set(ov or {}) - {"context", "calibration", "parity", "options"}
            if bad:
                raise RecipeError(f"recipe {origin}: presets.{pname}: only context, calibration, parity and options "
                                  f"may vary, not {sorted(bad)}")
            if not isinstance(ov.get("options", {}), dict) or set(ov.get("options", {})) - set(d["components"]):
                raise RecipeError(f"recipe {origin}: presets.{pname}.options must map component names "
                                  f"{list(d['components'])} to options")
            if "calibration" in ov:
                _make(CalibrationSpec, {**dataclasses.asdict(d.get("calibration") or CalibrationSpec()), **ov["calibration"]},
                      f"recipe {origin}: presets.{pname}.calibration")
            if "parity" in ov:
                _make(ParitySpec, {**dataclasses.asdict(d.get("parity") or ParitySpec()), **ov["parity"]},
                      f"recipe {origin}: presets.{pname}.parity")
        r = _make(Recipe, d, f"recipe {origin}")
    except RecipeError:
        raise
    for c, b in r.jobs():
        if c not in r.components:
            raise RecipeError(f"recipe {origin}: build {b.target}/{b.scheme} names component {c!r}, not in {list(r.components)}")
        if not r.thresholds_for(c, b.scheme):
            raise RecipeError(f"recipe {origin}: build {b.target}/{b.scheme} has no thresholds for {c}/{b.scheme}")
    if not isinstance(r.options, dict) or set(r.options) - set(r.components):
        raise RecipeError(f"recipe {origin}: options must map component names {list(r.components)} to options")
    if not isinstance(r.context, int) or r.context < 2:
        raise RecipeError(f"recipe {origin}: context must be an integer >= 2")
    return r


def shipped() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files(__package__).iterdir() if p.name.endswith(".yaml"))


def load_recipe(name_or_path: str) -> Recipe:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml"):
        if not p.is_file():
            raise RecipeError(f"recipe file {name_or_path} does not exist")
        text, origin = p.read_text(encoding="utf-8"), p.name
    else:
        res = resources.files(__package__).joinpath(f"{name_or_path}.yaml")
        if not res.is_file():
            raise RecipeError(f"no recipe named {name_or_path!r}; shipped: {', '.join(shipped())}")
        text, origin = res.read_text(encoding="utf-8"), name_or_path
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise RecipeError(f"recipe {origin} is not valid YAML: {str(e).splitlines()[0]}") from None
    return parse_recipe(data, origin)
