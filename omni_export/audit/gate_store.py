"""What the CI gate reads from a store, checked before anything is judged: every directory on every shelf, its
manifest, its exact file set, the recipe its manifest pins, the run report that measured it, and baselines.

Nothing here trusts a manifest's own account of itself: the file set is compared with what is on disk (no file
missing, none extra; a directory artifact such as an ``.mlpackage`` is hashed as a tree), and the recipe is found by
the hash the manifest pins, never by the thresholds the manifest carries.

Manifest fields read (written by ``pipeline``): ``artifact.{id, files, component}``, ``recipe.{name, hash}`` (the
pin: the sha256 of the recipe, with its command-line overrides, that built the artifact), ``thresholds``,
``parity.{runtime, bounded_steps, asked_steps, metrics}``, ``verdict``, and ``hub`` when AI Hub measured it.
"""
from __future__ import annotations

import datetime as _dt
import math
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from ..artifacts.hashing import hash_value
from ..artifacts.store import SHELVES
from ..errors import BadInput, OmniError
from .shelf_files import _kind, file_problem, load_json, not_regular  # noqa: F401 (file_problem re-exported)

BASELINE_SCHEMA = "omni-export/baseline/1"
MANIFEST = "manifest.json"
_SHA = re.compile(r"^[0-9a-f]{64}$")


@dataclass
class Entry:
    """One directory on a shelf: its manifest when valid, else ``problem`` says why it is not."""
    shelf: str
    recipe: str
    dir: Path
    manifest: dict | None
    problem: str | None = None

    @property
    def where(self) -> str:
        return f"{self.shelf}/{self.recipe}/{self.dir.name}"


def _finite(value, key: str) -> str | None:
    """Why a manifest or report value holds a non-finite number or a negative count (``key``: where it is)."""
    if isinstance(value, dict):
        return next((p for k, v in value.items() if (p := _finite(v, f"{key}.{k}"))), None)
    if isinstance(value, list):
        return next((p for i, v in enumerate(value) if (p := _finite(v, f"{key}[{i}]"))), None)
    if isinstance(value, float) and not math.isfinite(value):
        return f"{key} is {value!r}, not a finite number"
    last = key.rsplit(".", 1)[-1]
    if (last in ("steps", "sequences", "asked_steps", "bounded_steps", "first_step", "first_position")
            or last.endswith("_positions")) and value is not None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return f"{key} is {value!r}, not a count (an integer >= 0)"
    return None


def _figures_problem(metrics) -> str | None:
    """Why ``parity.metrics`` cannot be judged: each judged figure a number (null: not measured), every number
    finite, every count an integer >= 0."""
    from ..parity.gate import figure_problem
    from ..parity.metric_specs import names as metric_names

    if metrics is None:
        return None
    if not isinstance(metrics, dict):
        return "parity.metrics is not a mapping"
    rows = []
    for sect, names in (("outputs", metric_names("output")), ("lm", metric_names("lm")),
                        ("audio", metric_names("audio"))):
        v = metrics.get(sect)
        if v is None:
            continue
        if not isinstance(v, dict):
            return f"parity.metrics.{sect} is not a mapping"
        if sect == "outputs":
            for o, fig in v.items():
                if not isinstance(fig, dict):
                    return f"parity.metrics.outputs.{o} is not a mapping"
                rows += [(f"outputs.{o}.{k}", x) for k, x in fig.items() if k in names]
        else:
            rows += [(f"{sect}.{k}", x) for k, x in v.items() if k in names]
    for k, x in rows:
        if (why := figure_problem(x)) is not None:
            return f"parity.metrics.{k} {why}"
    return _finite(metrics, "parity.metrics")


def _manifest_problem(e: Entry, m) -> str | None:
    """Why ``m`` is not a valid manifest for the directory it sits in (None when it is)."""
    if not isinstance(m, dict):
        return "is not a JSON object"
    from pydantic import ValidationError

    from ..artifacts.manifest_schema import Manifest

    try:
        Manifest.model_validate(m)
    except ValidationError as err:
        first = err.errors()[0]
        return f"{'.'.join(str(x) for x in first['loc']) or '(top level)'}: {first['msg']}"
    try:
        art, rec, files = m["artifact"], m["recipe"], m["artifact"]["files"]
        checks = (("artifact.id", art["id"] == e.dir.name, f"names artifact {art['id']!r}"),
                  ("recipe.name", rec["name"] == e.recipe, f"names recipe {rec['name']!r}"),
                  ("artifact.files", isinstance(files, dict) and files, "lists no files"),
                  ("thresholds", isinstance(m["thresholds"], list), "is not a list"),
                  ("parity", isinstance(m["parity"], dict), "is not a mapping"),
                  ("verdict", isinstance(m["verdict"], dict), "is not a mapping"))
    except (KeyError, TypeError) as err:
        return f"lacks key {err}"
    for key, ok, what in checks:
        if not ok:
            return f"{key} {what} (directory {e.dir.name})" if key in ("artifact.id", "recipe.name") else f"{key} {what}"
    if not isinstance(rec.get("hash"), str) or not _SHA.match(rec["hash"]):
        return "recipe.hash (the pin of the recipe that built it) is missing or not a sha256"
    for fn, meta in files.items():
        if not isinstance(meta, dict) or not isinstance(meta.get("sha256"), str) or not isinstance(meta.get("bytes"), int):
            return f"artifact.files[{fn!r}] needs sha256 and bytes"
        if fn == MANIFEST or "/" in fn or "\0" in fn or fn.startswith(".") or fn in ("", ".."):
            return f"artifact.files[{fn!r}] is not a file name the store can hold"
    outs = (art.get("component") or {}).get("outputs")
    if outs is not None and (not isinstance(outs, list) or
                             not all(isinstance(o, list) and o and isinstance(o[0], str) for o in outs)):
        return "artifact.component.outputs is not a list of [name, shape] entries"
    local = m["verdict"].get("local")
    for v in [m["verdict"]] + ([local] if isinstance(local, dict) else []):
        if not isinstance(v.get("checks") or [], list) or not all(isinstance(c, dict) for c in v.get("checks") or []):
            return "verdict.checks is not a list of mappings"
    hub = m.get("hub") or {}
    if not isinstance(hub, dict):
        return "hub is not a mapping"
    for dev, h in hub.items():
        hp = h.get("parity") if isinstance(h, dict) else None
        if not isinstance(h, dict) or not isinstance(hp or {}, dict):
            return f"hub.{dev} is not a mapping with a parity mapping"
        if why := _figures_problem((hp or {}).get("metrics")):
            return f"hub.{dev}.{why}"
    return _figures_problem(m["parity"].get("metrics")) or _finite(
        {k: m["parity"].get(k) for k in ("asked_steps", "bounded_steps")}, "parity")


def _dir_problem(p: Path) -> str | None:
    """Why a shelf, recipe or artifact directory is not a real directory (a symlink to one is not)."""
    try:
        st = os.lstat(p)
    except OSError as e:
        return f"cannot be read: {e.strerror or e}"
    return None if stat.S_ISDIR(st.st_mode) else f"is {_kind(st.st_mode)}, not a directory"


def scan(root: Path, recipe: str | None = None) -> list[Entry]:
    """Every directory on every shelf (optionally of one recipe), with its manifest or the reason it has none."""
    root = Path(root)
    if not root.is_dir():
        raise BadInput(f"store {root} does not exist or is not a directory")
    out = []
    for shelf in SHELVES:
        if not os.path.lexists(root / shelf):
            continue
        if why := _dir_problem(root / shelf):
            out.append(Entry(shelf, "-", root / shelf, None, f"{shelf}/ {why}"))
            continue
        for rdir in sorted(p for p in (root / shelf).iterdir() if recipe is None or p.name == recipe):
            if why := _dir_problem(rdir):
                out.append(Entry(shelf, rdir.name, rdir, None, f"{shelf}/{rdir.name} {why} (a recipe directory "
                                                              "belongs here)"))
                continue
            for d in sorted(rdir.iterdir()):
                e = Entry(shelf, rdir.name, d, None)
                if why := _dir_problem(d):
                    e.problem = f"{e.where} {why}: artifacts are directories on the shelf" + \
                        (f" (it points to {os.readlink(d)})" if d.is_symlink() else "")
                elif (why := not_regular(d / MANIFEST)) == "is missing":
                    e.problem = f"{e.where}/{MANIFEST} is missing: the directory holds " \
                                f"{', '.join(sorted(p.name for p in d.iterdir())[:4]) or 'nothing'}"
                elif why:
                    e.problem = f"{e.where}/{MANIFEST} {why}"
                else:
                    try:
                        m = load_json(d / MANIFEST)
                    except ValueError as err:
                        m, e.problem = None, f"{e.where}/{MANIFEST} is not valid JSON: {err}"
                    if e.problem is None:
                        try:
                            why = _manifest_problem(e, m)
                        except RecursionError:
                            why = "is nested too deeply to validate"
                        e.manifest, e.problem = (m, None) if why is None else (None, f"{e.where}/{MANIFEST}: {why}")
                out.append(e)
    if not out:
        what = f"artifacts of recipe {recipe!r}" if recipe else "artifacts"
        raise BadInput(f"store {root} has no {what} (no {'/'.join(SHELVES)}/<recipe>/<artifact>/{MANIFEST})")
    return out


def verify_files(artifact_dir: Path, manifest: dict) -> list[str]:
    """Problems with the artifact's file set, each naming the file: missing, not a regular file (a symlink, FIFO or
    device is never opened), modified, resized or not listed. A file is read only up to its recorded size."""
    problems = []
    files = manifest["artifact"]["files"]
    present = {p.name for p in artifact_dir.iterdir()} - {MANIFEST}
    for fn in sorted(present - set(files)):
        problems.append(f"{fn} is not listed in the manifest (an extra file in a shipped directory)")
    for fn, meta in sorted(files.items()):
        if why := file_problem(artifact_dir / fn, meta):
            problems.append(why)
    return problems


# -- the pinned recipe and the run that measured an artifact ----------------------------------------------------
class Runs:
    """The run reports of a store, found by the recipe hash they were run with (the manifests' pin)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._reports: dict[str, list[tuple[Path, dict, str]]] = {}

    def reports(self, recipe: str) -> list[tuple[Path, dict, str]]:
        """(path, report, the hash of the recipe it ran) of every readable run report of ``recipe``, newest first."""
        if recipe not in self._reports:
            found = []
            for p in sorted((self.root / "runs" / recipe).glob("*/report.json"), reverse=True):
                try:  # a report that is not a regular JSON file of bounded size is not one of this store's runs
                    rep = load_json(p)
                    pin = hash_value(rep["recipe"]) if isinstance(rep, dict) and isinstance(rep.get("recipe"), dict) \
                        else None
                except (OSError, ValueError, RecursionError):
                    continue
                if pin is not None:
                    found.append((p, rep, pin))
            self._reports[recipe] = found
        return self._reports[recipe]

    def pinned(self, recipe: str, pin: str):
        """(Recipe, where it came from) for the recipe whose hash is ``pin``, or (None, why not)."""
        from ..recipes import load_recipe, parse_recipe, shipped

        kept = self.root / "recipes" / f"{pin}.json"
        if os.path.lexists(kept):
            try:
                data = load_json(kept)
                r = parse_recipe(data, f"recipes/{pin}.json")
            except (OSError, ValueError, RecursionError, OmniError) as err:
                return None, f"recipes/{pin}.json does not parse: {err}"
            if r.hash != pin or r.name != recipe:
                return None, f"recipes/{pin}.json is recipe {r.name} with hash {r.hash[:12]}…, not the pinned one"
            return r, f"recipes/{pin[:12]}….json"
        for p, rep, ran in self.reports(recipe):
            if ran == pin:
                try:
                    return parse_recipe(rep["recipe"], str(p.relative_to(self.root))), str(p.relative_to(self.root))
                except OmniError as err:
                    return None, f"the run report {p.relative_to(self.root)} holding it does not parse: {err}"
        ship = load_recipe(recipe) if recipe in shipped() else None  # by name only: a shelf name is never a path
        if ship is not None and ship.hash == pin:
            return ship, f"shipped recipe {recipe}"
        return None, (f"no recipe with the pinned hash {pin[:12]}… (not in recipes/, no run report under runs/{recipe}/, "
                      f"not the shipped {recipe})")

    def measured(self, recipe: str, pin: str, artifact_id: str) -> tuple[str, dict] | None:
        """(report path, artifact entry) of the newest run of ``pin`` that measured ``artifact_id``."""
        for p, rep, ran in self.reports(recipe):
            if ran == pin:
                for a in rep.get("artifacts") if isinstance(rep.get("artifacts"), list) else []:
                    if isinstance(a, dict) and a.get("id") == artifact_id:
                        return str(p.relative_to(self.root)), a
        return None


# -- baselines ------------------------------------------------------------------------------------
def read_baseline(path: Path) -> dict:
    """A committed baseline, every entry checked: figures finite numbers (or null), steps a count, files sha256s.
    Anything else is one ``BadInput`` line naming the entry (exit 2: the CI job's input is broken)."""
    path = Path(path)
    if not os.path.lexists(path):
        raise BadInput(f"baseline {path} does not exist (create it with --write-baseline)")
    try:
        b = load_json(path)
    except (OSError, ValueError) as e:
        raise BadInput(f"baseline {path} {e}") from None
    if not (isinstance(b, dict) and b.get("schema") == BASELINE_SCHEMA and isinstance(b.get("artifacts"), dict)):
        raise BadInput(f"baseline {path} is not an omni-export baseline ({BASELINE_SCHEMA} with an artifacts mapping)")
    for key, a in b["artifacts"].items():
        where = f"baseline {path}: artifacts[{key!r}]"
        if not isinstance(a, dict) or "/" not in key:
            raise BadInput(f"{where} is not a mapping under a 'recipe/artifact' key")
        figs, steps, files = a.get("figures"), a.get("steps"), a.get("files", {})
        if not isinstance(figs, dict) or not figs:
            raise BadInput(f"{where}.figures is missing or empty: every baselined artifact has figures")
        for k, v in figs.items():
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
                raise BadInput(f"{where}.figures[{k!r}] is {v!r}, not a finite number")
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 0):
            raise BadInput(f"{where}.steps is {steps!r}, not a count (an integer >= 0)")
        if not isinstance(files, dict) or not all(isinstance(v, str) and _SHA.match(v) for v in files.values()):
            raise BadInput(f"{where}.files is not a mapping of file names to sha256")
    return b


def baseline_from(artifacts, previous: dict | None = None) -> dict:
    """A baseline of the checked artifacts' figures; entries of recipes not checked this time are kept."""
    recipes = {a.recipe for a in artifacts}
    kept = {k: v for k, v in ((previous or {}).get("artifacts") or {}).items() if k.split("/", 1)[0] not in recipes}
    arts = {a.key: {"runtime": a.runtime, "steps": a.steps, "files": a.files, "figures": a.figures}
            for a in artifacts if a.figures}
    return {"schema": BASELINE_SCHEMA, "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "artifacts": dict(sorted({**kept, **arts}.items()))}
