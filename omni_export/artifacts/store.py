"""The artifact store: atomic writes, a step cache keyed by input hashes, and published / blocked / unverified shelves.

Layout under the store root::

    cache/<kind>/<key>/            finished steps (a ``.done`` marker is written last); reruns resume from here
    published/<recipe>/<artifact>/ artifacts that passed their parity gate, with manifest.json
    blocked/<recipe>/<artifact>/   artifacts the gate refused, with the reason in manifest.json; never published
    unverified/<recipe>/<artifact>/ artifacts no runtime here can execute; never published as passing
    runs/<recipe>/<stamp>/         the run's report (JSON and markdown)

Everything is written into a private temporary directory beside its destination and renamed into place, so a
crash, a full disk or Ctrl-C never leaves a half-written step or artifact where a reader would find it.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Callable, Iterator

from ..errors import BadInput, StoreIOError
from .hashing import hash_value

SHELVES = ("published", "blocked", "unverified")


def _io_error(e: OSError, what: Path) -> StoreIOError:
    if e.errno == errno.ENOSPC:
        return StoreIOError(f"disk full while writing {what}; nothing was left half-written")
    return StoreIOError(f"cannot write {what}: {e.strerror or e}")


def _fsync_tree(root: Path):
    for p in sorted(root.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())


@contextlib.contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield a fresh temporary directory; on success it replaces ``final`` in one rename, on failure it vanishes."""
    final = Path(final)
    tmp = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
    except OSError as e:
        raise _io_error(e, final) from None
    try:
        yield tmp
        _fsync_tree(tmp)
        old = None
        if final.exists():
            old = final.parent / f".old-{final.name}-{uuid.uuid4().hex[:8]}"
            os.replace(final, old)
        os.replace(tmp, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _io_error(e, final) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _link_or_copy(src, dst):
    try:
        os.link(src, dst)  # same filesystem: no copy of large weights
    except OSError:
        shutil.copy2(src, dst)
    return dst


def read_json(path: Path, what: str, valid: Callable[[object], bool], missing_hint: str = "") -> dict:
    """A JSON input the user pointed at, or one ``BadInput`` line naming the file and what is wrong with it."""
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"{what} {path} does not exist{missing_hint}")
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise BadInput(f"{what} {path} is not valid JSON: {e}") from None
    if not valid(value):
        raise BadInput(f"{what} {path} is not an omni-export {what}")
    return value


def write_json_atomic(path: Path, value) -> None:
    path = Path(path)
    tmp = path.parent / f".tmp-{path.name}-{uuid.uuid4().hex[:8]}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w") as f:
            json.dump(value, f, indent=2, sort_keys=False, default=str)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise _io_error(e, path) from None


class Store:
    def __init__(self, root: Path):
        self.root = Path(root)

    # -- the step cache -------------------------------------------------------------------------
    def step_dir(self, kind: str, key: dict) -> Path:
        return self.root / "cache" / kind / hash_value(key)[:20]

    def cached(self, kind: str, key: dict) -> Path | None:
        d = self.step_dir(kind, key)
        return d if (d / ".done").exists() else None

    def run_step(self, kind: str, key: dict, build: Callable[[Path], None]) -> tuple[Path, bool]:
        """Return (directory, reused). ``build(tmp)`` writes the step's files; it runs only if no finished copy exists."""
        d = self.step_dir(kind, key)
        if (d / ".done").exists():
            return d, True
        with atomic_dir(d) as tmp:
            build(tmp)
            (tmp / "key.json").write_text(json.dumps(key, indent=2, sort_keys=True, default=str))
            (tmp / ".done").write_text("")
        return d, False

    # -- shelves ----------------------------------------------------------------------------------
    def shelf_dir(self, shelf: str, recipe: str, artifact_id: str) -> Path:
        assert shelf in SHELVES
        return self.root / shelf / recipe / artifact_id

    def place(self, shelf: str, recipe: str, artifact_id: str, files: dict[str, Path], manifest: dict) -> Path:
        """Put an artifact's files and manifest on one shelf, removing any copy of it from the other shelves.

        A rebuilt artifact that is now blocked is therefore never left published from an earlier run."""
        final = self.shelf_dir(shelf, recipe, artifact_id)
        with atomic_dir(final) as tmp:
            for name, src in files.items():
                dst = tmp / name
                dst.parent.mkdir(parents=True, exist_ok=True)
                if Path(src).is_dir():  # a directory artifact (e.g. an .mlpackage): its files linked one by one
                    shutil.copytree(src, dst, copy_function=_link_or_copy)
                    continue
                _link_or_copy(src, dst)
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str) + "\n")
        for other in SHELVES:
            if other != shelf:
                stale = self.shelf_dir(other, recipe, artifact_id)
                if stale.exists():
                    shutil.rmtree(stale)
        return final

    def manifests(self, shelves=SHELVES) -> Iterator[tuple[Path, dict]]:
        for shelf in shelves:
            for m in sorted((self.root / shelf).glob("*/*/manifest.json")):
                yield m.parent, json.loads(m.read_text())
