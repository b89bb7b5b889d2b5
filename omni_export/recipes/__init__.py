"""Recipes: frozen, typed values read from YAML (pydantic dataclasses: unknown keys are errors, every field has a
type, and ``dataclasses.replace`` re-validates). A name means exactly what it builds.

``load_recipe("spark_w8a16")`` finds a shipped recipe; a path to a ``.yaml`` file works too. Every error is one line
naming the file, the key path and what was expected. ``docs/schemas/recipe.schema.json`` is the JSON Schema
(``python -m omni_export.commands.schemas docs/schemas`` writes it; ``tests/recipes/test_recipes.py`` keeps it
current).
"""
from __future__ import annotations

import dataclasses
import inspect
import stat
import typing
from dataclasses import field
from importlib import resources
from pathlib import Path
from typing import Annotated, Optional, Union

import yaml
from pydantic import (AfterValidator, ConfigDict, Field, create_model, StrictBool, StrictFloat, StrictInt, StrictStr, TypeAdapter, ValidationError,
                      WrapValidator, model_validator)
from pydantic.dataclasses import dataclass

from ..artifacts.hashing import hash_value
from ..artifacts.names import NAME_RE, name_problem
from ..errors import RecipeError
from ..parity.gate import Threshold
from .yaml_load import _TooLarge, load_yaml

SCHEMA = "omni-export/recipe/1"
STRICT = ConfigDict(extra="forbid")
PosInt = Annotated[StrictInt, Field(ge=1)]
FiniteFloat = Annotated[StrictFloat, Field(allow_inf_nan=False)]
OptionValue = Union[StrictBool, StrictInt, FiniteFloat, StrictStr, None]
CONTEXT_MAX = 1 << 20  # tokens; the largest shipped context is 1,024
SEED_MAX = 2**32 - 1  # numpy's and torch's generators both take a seed in [0, 2**32) (``--seed`` is checked against it too)
Seed = Annotated[StrictInt, Field(ge=0, le=SEED_MAX)]

RECIPE_MAX_BYTES = 1 << 20  # a recipe file's size bound (the shipped ones: at most 6.3 KB); the YAML's: yaml_load


def check_name(name, what: str) -> str:
    """``name`` if it is safe as one directory of the store, else one ``RecipeError`` line."""
    if (why := name_problem(name)) is not None:
        raise RecipeError(f"{what} {str(name)[:60]!r} {why}")
    return name


def _name(value):
    if (why := name_problem(value)) is not None:
        raise ValueError(why)
    return value


RECIPE_NAME_MAX = 100  # a recipe file's ``name``; names the tool derives from it (a sweep's) may be longer
SafeName = Annotated[StrictStr, AfterValidator(_name),
                     Field(json_schema_extra={"pattern": f"^{NAME_RE.pattern}$", "maxLength": RECIPE_NAME_MAX})]


def _threshold(value, handler):
    """gate.Threshold checks its own metric, bound and reason: its one-line error becomes this key's error."""
    try:
        return handler(value)
    except RecipeError as e:
        raise ValueError(str(e)) from None


GateThreshold = Annotated[Threshold, WrapValidator(_threshold)]


@dataclass(frozen=True, config=STRICT)
class ModelSpec:
    family: StrictStr
    preset: Optional[StrictStr] = "tiny"
    seed: Seed = 0
    checkpoint: Optional[StrictStr] = None


@dataclass(frozen=True, config=STRICT)
class PromptSpec:
    calibration: StrictStr
    parity: StrictStr
    max_prompt_tokens: PosInt = 16


@dataclass(frozen=True, config=STRICT)
class CalibrationSpec:
    max_samples: PosInt = 128
    new_tokens: PosInt = 32


@dataclass(frozen=True, config=STRICT)
class ParitySpec:
    new_tokens: PosInt = 32
    simulator_steps: PosInt = 188  # graph calls on the (slow) HTP simulator per artifact
    max_prompts: Optional[PosInt] = None  # parity over the first N prompts of the set (None: all); bounds a full-size run


@dataclass(frozen=True, config=STRICT)
class Build:
    target: StrictStr
    scheme: StrictStr
    components: Optional[tuple[StrictStr, ...]] = None  # default: every component of the recipe


@dataclass(frozen=True, config=STRICT)
class PresetOverride:
    """What a preset may change: context, calibration, parity and component options (merged over the recipe's)."""
    context: Optional[StrictInt] = None
    calibration: dict[StrictStr, PosInt] = field(default_factory=dict)
    parity: dict[StrictStr, Optional[PosInt]] = field(default_factory=dict)
    options: dict[StrictStr, dict[StrictStr, OptionValue]] = field(default_factory=dict)


def _one_or_list(v):
    return [v] if isinstance(v, str) else v


@dataclass(frozen=True, config=STRICT)
class Recipe:
    name: SafeName
    description: StrictStr
    model: ModelSpec
    components: Annotated[tuple[StrictStr, ...], Field(min_length=1)]
    context: Annotated[StrictInt, Field(ge=2, le=CONTEXT_MAX)]
    device: StrictStr
    prompts: PromptSpec
    builds: Annotated[tuple[Build, ...], Field(min_length=1)]
    # "scheme" or "component/scheme" -> thresholds
    thresholds: dict[StrictStr, tuple[GateThreshold, ...]] = field(default_factory=dict)
    calibration: CalibrationSpec = CalibrationSpec()
    parity: ParitySpec = ParitySpec()
    expect_blocked: StrictBool = False  # a recipe of known-broken schemes: the gate must block it
    # component name -> keyword options of its factory (e.g. parts); checked against the factory before any work
    options: dict[StrictStr, dict[StrictStr, OptionValue]] = field(default_factory=dict)
    presets: dict[StrictStr, PresetOverride] = field(default_factory=dict)
    # what ``omni-export sweep NAME`` runs without ``--schemes`` (empty: the sweep's own list, ``sweep.SCHEMES``)
    sweep_schemes: tuple[StrictStr, ...] = ()

    @model_validator(mode="after")
    def _consistent(self):
        from ..schemes import SCHEMES
        unknown = [s for s in self.sweep_schemes if s not in SCHEMES]
        if unknown:
            raise ValueError(f"sweep_schemes names unknown schemes {unknown}; known: {', '.join(SCHEMES)}")
        for c, b in self.jobs():
            if c not in self.components:
                raise ValueError(f"build {b.target}/{b.scheme} names component {c!r}, not in {list(self.components)}")
            if not self.thresholds_for(c, b.scheme):
                raise ValueError(f"build {b.target}/{b.scheme} has no thresholds for {c}/{b.scheme}")
        for where, opts in [("options", self.options)] + [(f"presets.{p}.options", o.options)
                                                          for p, o in self.presets.items()]:
            if set(opts) - set(self.components):
                raise ValueError(f"{where} names {sorted(set(opts) - set(self.components))}: expected components "
                                 f"of the recipe {list(self.components)}")
        return self

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
        d["presets"] = {k: {f: v for f, v in p.items() if v not in (None, {})} for k, p in d["presets"].items()}
        return d

    def with_overrides(self, **kw) -> "Recipe":
        """CLI overrides: preset, seed, checkpoint, context, device, simulator_steps, parts."""
        try:
            return _overrides(self, kw)
        except ValidationError as e:
            raise RecipeError(f"recipe {self.name}: override {_first(e)}") from None


def _overrides(r: Recipe, kw: dict) -> Recipe:
    model = {k: kw.pop(k) for k in ("preset", "seed", "checkpoint") if kw.get(k) is not None}
    if model:
        if "checkpoint" in model:
            model["preset"] = None
        r = dataclasses.replace(r, model=dataclasses.replace(r.model, **model))
    ov = r.presets.get(r.model.preset) if r.model.preset else None
    if ov:
        r = dataclasses.replace(
            r, context=ov.context if ov.context is not None else r.context,
            calibration=dataclasses.replace(r.calibration, **ov.calibration),
            parity=dataclasses.replace(r.parity, **ov.parity),
            options={c: {**r.options.get(c, {}), **ov.options.get(c, {})} for c in set(r.options) | set(ov.options)})
    for o in kw.pop("option", None) or []:
        r = _with_option(r, o)
    if kw.get("simulator_steps") is not None:
        r = dataclasses.replace(r, parity=dataclasses.replace(r.parity, simulator_steps=kw.pop("simulator_steps")))
    parts = kw.pop("parts", None)
    if parts is not None:
        parts = int(parts) if isinstance(parts, str) and parts.isdigit() else parts
        r = dataclasses.replace(r, options={c: {**r.options.get(c, {}), "parts": parts} for c in r.components})
    rest = {k: v for k, v in kw.items() if v is not None}
    unknown = set(rest) - {"context", "device"}
    if unknown:
        raise RecipeError(f"unknown override(s): {sorted(unknown)}")
    return dataclasses.replace(r, **rest) if rest else r


_ADAPTER = TypeAdapter(Recipe)


def json_schema() -> dict:
    return {"$id": SCHEMA, **_ADAPTER.json_schema()}


def _path(loc) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part not in ("function-after[_consistent()]",) and not str(part).startswith(("function-", "json-or")):
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _with_option(r: Recipe, option: str) -> Recipe:
    """``COMPONENT.KEY=VALUE`` (VALUE read as YAML) merged over the recipe's options of that component; the merged
    options are checked against the component's factory with the rest of the recipe, before any work."""
    target, eq, value = str(option).partition("=")
    comp, dot, key = target.partition(".")
    if not (eq and dot and comp and key):
        raise RecipeError(f"--option {option}: expected COMPONENT.KEY=VALUE")
    if comp not in r.components:
        raise RecipeError(f"--option {option}: recipe {r.name} has no component {comp!r}; it has {sorted(r.components)}")
    try:
        parsed = load_yaml(value)
    except yaml.YAMLError as err:
        raise RecipeError(f"--option {option}: VALUE is not YAML: {str(err).splitlines()[0]}") from None
    except _TooLarge as err:
        raise RecipeError(f"--option {option}: VALUE {err}") from None
    return dataclasses.replace(r, options={**r.options, comp: {**r.options.get(comp, {}), key: parsed}})


def _first(e: ValidationError) -> str:
    """The first error, one line; an unknown key goes first (a misspelt key also makes the intended one missing)."""
    errs = sorted(e.errors(include_url=False),
                  key=lambda x: x["type"] not in ("unexpected_keyword_argument", "extra_forbidden"))
    err = errs[0]
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
        msg = "unknown key"
    elif err["type"] == "missing" or err["type"] == "missing_argument":
        msg = "required key missing"
    quiet = ("missing", "missing_argument", "value_error", "unexpected_keyword_argument", "extra_forbidden")
    got = "" if err["type"] in quiet else f" (got {err.get('input')!r})"
    more = f" (and {len(errs) - 1} more error(s))" if len(errs) > 1 else ""
    return f"{_path(err['loc'])}: {msg}{got}{more}"


def parse_recipe(data, origin: str) -> Recipe:
    if not isinstance(data, dict):
        raise RecipeError(f"recipe {origin}: (top level): expected a mapping, got {type(data).__name__}")
    data = {**data, "components": _one_or_list(data.get("components"))} if "components" in data else data
    try:
        r = _ADAPTER.validate_python(data)
    except ValidationError as e:
        raise RecipeError(f"recipe {origin}: {_first(e)}") from None
    if (why := name_problem(r.name, RECIPE_NAME_MAX)) is not None:
        raise RecipeError(f"recipe {origin}: name: {why}")
    for p in r.presets:  # every preset must give a valid recipe too
        try:
            _overrides(r, {"preset": p})
        except ValidationError as e:
            raise RecipeError(f"recipe {origin}: presets.{p}: {_first(e)}") from None
    return r


def validate_options(factory, options: dict, where: str) -> dict:
    """A component's recipe options checked against its factory before any work, and returned in the one validated
    form the factory then receives. The factory's keyword parameters (after ``bundle`` and ``context``) and their
    annotations are the schema; a factory may instead carry ``options_schema`` (a pydantic model or dataclass).
    A factory that only takes ``**options`` checks them itself when it is called."""
    schema = getattr(factory, "options_schema", None)
    if schema is None:
        params = list(inspect.signature(factory).parameters.values())[1:]
        try:
            hints = typing.get_type_hints(factory.__init__ if inspect.isclass(factory) else factory)
        except Exception:  # an annotation that does not resolve: check names and presence only
            hints = {}
        loose = any(p.kind is p.VAR_KEYWORD for p in params)
        fields = {p.name: (hints.get(p.name, typing.Any), ... if p.default is p.empty else p.default)
                  for p in params if p.name != "context" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
        schema = create_model("Options", __config__=ConfigDict(extra="allow" if loose else "forbid", strict=True,
                                                               arbitrary_types_allowed=True), **fields)
    try:
        value = TypeAdapter(schema).validate_python(options)
    except ValidationError as e:
        raise RecipeError(f"{where}.{_first(e)}") from None
    if hasattr(value, "model_dump"):
        return value.model_dump(exclude_unset=True)
    return {k: v for k, v in dataclasses.asdict(value).items() if k in options} if dataclasses.is_dataclass(value) \
        else dict(value)


def shipped() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files(__package__).iterdir() if p.name.endswith(".yaml"))


def _read(name_or_path: str) -> tuple[bytes, str]:
    if "\0" in name_or_path:
        raise RecipeError(f"recipe {name_or_path!r}: a NUL byte is in the name")
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml"):
        try:
            st = p.stat()
        except FileNotFoundError:
            raise RecipeError(f"recipe file {name_or_path} does not exist") from None
        except OSError as e:
            raise RecipeError(f"recipe file {name_or_path} cannot be read: {e.strerror}") from None
        if stat.S_ISDIR(st.st_mode):
            raise RecipeError(f"recipe file {name_or_path} is a directory, not a file")
        if not stat.S_ISREG(st.st_mode):
            raise RecipeError(f"recipe file {name_or_path} is not a regular file")
        if st.st_size > RECIPE_MAX_BYTES:
            raise RecipeError(f"recipe file {name_or_path} is {st.st_size} bytes (a recipe is at most "
                              f"{RECIPE_MAX_BYTES})")
        try:
            with open(p, "rb") as f:
                return f.read(RECIPE_MAX_BYTES + 1), str(p)
        except OSError as e:
            raise RecipeError(f"recipe file {name_or_path} cannot be read: {e.strerror}") from None
    if name_problem(name_or_path) is not None:
        raise RecipeError(f"no recipe named {name_or_path[:60]!r} (a path to a recipe file ends in .yaml); shipped: "
                          f"{', '.join(shipped())}")
    res = resources.files(__package__).joinpath(f"{name_or_path}.yaml")
    if not res.is_file():
        raise RecipeError(f"no recipe named {name_or_path!r}; shipped: {', '.join(shipped())}")
    return res.read_bytes(), name_or_path


def load_recipe(name_or_path: str) -> Recipe:
    raw, origin = _read(name_or_path)
    if len(raw) > RECIPE_MAX_BYTES:
        raise RecipeError(f"recipe {origin} is more than {RECIPE_MAX_BYTES} bytes (a recipe is at most that)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise RecipeError(f"recipe {origin}: not UTF-8 text (byte 0x{raw[e.start]:02x} on line {line}); save the "
                          "file as UTF-8") from None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise RecipeError(f"recipe {origin} is not valid YAML{where}: {problem}") from None
    except _TooLarge as e:
        raise RecipeError(f"recipe {origin}: the YAML {e}") from None
    return parse_recipe(data, origin)
