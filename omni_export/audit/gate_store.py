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
import json
import re
from dataclasses import dataclass
from pathlib import Path

from ..artifacts.hashing import hash_file, hash_value, path_bytes
from ..artifacts.store import SHELVES, read_json
from ..errors import BadInput, OmniError

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
        if fn == MANIFEST or "/" in fn or fn.startswith("."):
            return f"artifact.files[{fn!r}] is not a file name the store can hold"
    return None


def scan(root: Path, recipe: str | None = None) -> list[Entry]:
    """Every directory on every shelf (optionally of one recipe), with its manifest or the reason it has none."""
    root = Path(root)
    if not root.is_dir():
        raise BadInput(f"store {root} does not exist or is not a directory")
    out = []
    for shelf in SHELVES:
        for rdir in sorted(p for p in (root / shelf).glob("*") if recipe is None or p.name == recipe):
            if not rdir.is_dir():
                out.append(Entry(shelf, rdir.name, rdir, None, f"{shelf}/{rdir.name} is a file where a recipe "
                                                              "directory belongs"))
                continue
            for d in sorted(rdir.iterdir()):
                e = Entry(shelf, rdir.name, d, None)
                if not d.is_dir():
                    e.problem = f"{e.where} is a stray file on the shelf (artifacts are directories)"
                elif not (d / MANIFEST).is_file():
                    e.problem = f"{e.where}/{MANIFEST} is missing: the directory holds " \
                                f"{', '.join(sorted(p.name for p in d.iterdir())[:4]) or 'nothing'}"
                else:
                    try:
                        m = json.loads((d / MANIFEST).read_text())
                    except (OSError, ValueError) as err:
                        m, e.problem = None, f"{e.where}/{MANIFEST} is not valid JSON: {err}"
                    if e.problem is None:
                        why = _manifest_problem(e, m)
                        e.manifest, e.problem = (m, None) if why is None else (None, f"{e.where}/{MANIFEST}: {why}")
                out.append(e)
    if not out:
        what = f"artifacts of recipe {recipe!r}" if recipe else "artifacts"
        raise BadInput(f"store {root} has no {what} (no {'/'.join(SHELVES)}/<recipe>/<artifact>/{MANIFEST})")
    return out


def verify_files(artifact_dir: Path, manifest: dict) -> list[str]:
    """Problems with the artifact's file set, each naming the file: missing, modified, resized or not listed."""
    problems = []
    files = manifest["artifact"]["files"]
    present = {p.name for p in artifact_dir.iterdir()} - {MANIFEST}
    for fn in sorted(present - set(files)):
        problems.append(f"{fn} is not listed in the manifest (an extra file in a shipped directory)")
    for fn, meta in sorted(files.items()):
        p = artifact_dir / fn
        if not p.exists():
            problems.append(f"{fn} is missing")
            continue
        digest, size = hash_file(p), path_bytes(p)  # a directory (e.g. .mlpackage) as a tree of relative paths
        if digest != meta["sha256"]:
            problems.append(f"{fn} was modified: sha256 {digest[:12]}… != manifest {meta['sha256'][:12]}…")
        elif size != meta["bytes"]:
            problems.append(f"{fn} has {size} bytes, manifest says {meta['bytes']}")
    return problems


# -- the pinned recipe and the run that measured an artifact ----------------------------------------------------
class Runs:
    """The run reports of a store, found by the recipe hash they were run with (the manifests' pin)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._reports: dict[str, list[tuple[Path, dict]]] = {}

    def reports(self, recipe: str) -> list[tuple[Path, dict]]:
        if recipe not in self._reports:
            found = []
            for p in sorted((self.root / "runs" / recipe).glob("*/report.json"), reverse=True):
                try:
                    rep = json.loads(p.read_text())
                except (OSError, ValueError):
                    continue
                if isinstance(rep, dict) and isinstance(rep.get("recipe"), dict):
                    found.append((p, rep))
            self._reports[recipe] = found
        return self._reports[recipe]

    def pinned(self, recipe: str, pin: str):
        """(Recipe, where it came from) for the recipe whose hash is ``pin``, or (None, why not)."""
        from ..recipes import load_recipe, parse_recipe

        kept = self.root / "recipes" / f"{pin}.json"
        if kept.is_file():
            try:
                data = json.loads(kept.read_text())
                r = parse_recipe(data, f"recipes/{pin}.json")
            except (OSError, ValueError, OmniError) as err:
                return None, f"recipes/{pin}.json does not parse: {err}"
            if r.hash != pin or r.name != recipe:
                return None, f"recipes/{pin}.json is recipe {r.name} with hash {r.hash[:12]}…, not the pinned one"
            return r, f"recipes/{pin[:12]}….json"
        for p, rep in self.reports(recipe):
            if hash_value(rep["recipe"]) == pin:
                try:
                    return parse_recipe(rep["recipe"], str(p.relative_to(self.root))), str(p.relative_to(self.root))
                except OmniError as err:
                    return None, f"the run report {p.relative_to(self.root)} holding it does not parse: {err}"
        try:
            shipped = load_recipe(recipe)
        except OmniError:
            shipped = None
        if shipped is not None and shipped.hash == pin:
            return shipped, f"shipped recipe {recipe}"
        return None, (f"no recipe with the pinned hash {pin[:12]}… (not in recipes/, no run report under runs/{recipe}/, "
                      f"not the shipped {recipe})")

    def measured(self, recipe: str, pin: str, artifact_id: str) -> tuple[str, dict] | None:
        """(report path, artifact entry) of the newest run of ``pin`` that measured ``artifact_id``."""
        for p, rep in self.reports(recipe):
            if hash_value(rep["recipe"]) == pin:
                for a in rep.get("artifacts") or []:
                    if isinstance(a, dict) and a.get("id") == artifact_id:
                        return str(p.relative_to(self.root)), a
        return None


# -- baselines ------------------------------------------------------------------------------------
def read_baseline(path: Path) -> dict:
    return read_json(path, "baseline", lambda b: isinstance(b, dict) and b.get("schema") == BASELINE_SCHEMA
                     and isinstance(b.get("artifacts"), dict), " (create it with --write-baseline)")


def baseline_from(artifacts, previous: dict | None = None) -> dict:
    """A baseline of the checked artifacts' figures; entries of recipes not checked this time are kept."""
    recipes = {a.recipe for a in artifacts}
    kept = {k: v for k, v in ((previous or {}).get("artifacts") or {}).items() if k.split("/", 1)[0] not in recipes}
    arts = {a.key: {"runtime": a.runtime, "steps": a.steps, "files": a.files, "figures": a.figures}
            for a in artifacts if a.figures}
    return {"schema": BASELINE_SCHEMA, "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "artifacts": dict(sorted({**kept, **arts}.items()))}
