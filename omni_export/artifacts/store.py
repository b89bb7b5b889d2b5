"""The artifact store: a step cache keyed by input hashes, and published / blocked / unverified shelves.

Layout under the store root::

    cache/<kind>/<key>/             finished steps (``.done`` lists every file's sha256 and is written last)
    published/<recipe>/<artifact>/  artifacts that passed their parity gate, with manifest.json
    blocked/<recipe>/<artifact>/    artifacts the gate refused, with the reason in manifest.json; never published
    unverified/<recipe>/<artifact>/ artifacts no runtime here can execute; never published as passing
    retracted/<recipe>/<artifact>/  an earlier publication whose rebuild started and did not finish (not a shelf)
    runs/<recipe>/<stamp>/          the run's report (JSON and markdown)
    .lock                           held by the one run writing the store

Everything is written through ``atomic`` (temporary name beside the destination, fsync, rename), so a crash, a full
disk, Ctrl-C or SIGTERM never leaves a half-written step or artifact where a reader would find it. A cache entry is
re-hashed before every reuse; a damaged one is evicted and rebuilt. Published files are private copies (reflinks
where the filesystem has them) of the cache's, never hard links: see docs/recipes.md "Store".
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Callable, Iterator

from filelock import FileLock, Timeout

from ..errors import BadInput, StoreBusy, StoreIOError
from .atomic import (atomic_dir, clone_tree, dumps_json, io_error, sweep_temporaries, temp_path, write_json_atomic,
                     write_text_atomic)
from .hashing import hash_file, hash_many, hash_value

SHELVES = ("published", "blocked", "unverified")
SHELF_OF = {"pass": "published", "blocked": "blocked", "unverified": "unverified"}  # THE verdict -> shelf map
RETRACTED = "retracted"
DONE = ".done"
LOCK = ".lock"

_locks: dict[str, FileLock] = {}
_locks_guard = threading.Lock()


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


def shelf_for(status: str) -> str:
    """The shelf an artifact with this verdict status belongs on (the one map every module uses)."""
    try:
        return SHELF_OF[status]
    except KeyError:
        raise ValueError(f"unknown verdict status {status!r}; known: {', '.join(SHELF_OF)}") from None


def _entry_hashes(d: Path) -> dict[str, str]:
    files = [p for p in sorted(d.rglob("*")) if p.is_file() and p.name != DONE]
    return dict(zip((p.relative_to(d).as_posix() for p in files), hash_many(files)))


class Store:
    def __init__(self, root: Path):
        self.root = Path(root)
        self._verified: set[Path] = set()

    # -- one writer ------------------------------------------------------------------------------
    def _lock(self) -> FileLock:
        key = str(self.root.resolve())
        with _locks_guard:  # one FileLock object per store in this process: it counts re-entries
            if key not in _locks:
                _locks[key] = FileLock(str(self.root / LOCK), thread_local=False)
            return _locks[key]

    @contextlib.contextmanager
    def writer(self, wait: bool = True, on_wait: Callable[[str], None] | None = None) -> Iterator["Store"]:
        """Hold the store's writer lock for the block. A second run waits (saying so once through ``on_wait``) or,
        with ``wait=False``, fails with one line. Whoever takes the lock first removes stale ``.tmp-*`` entries."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise io_error(e, self.root) from None
        lock = self._lock()
        first = not lock.is_locked
        try:
            lock.acquire(timeout=0)
        except Timeout:
            msg = f"store {self.root} is being written by another omni-export run"
            if not wait:
                raise StoreBusy(f"{msg}; wait for it to finish or use another --store") from None
            if on_wait:
                on_wait(f"{msg}; waiting for it to finish")
            lock.acquire()
        except OSError as e:
            raise io_error(e, self.root / LOCK) from None
        try:
            if first:
                self._verified.clear()  # a new run re-hashes every cache entry it reuses
                sweep_temporaries(self.root)
            yield self
        finally:
            lock.release()

    # -- the step cache -------------------------------------------------------------------------
    def step_dir(self, kind: str, key: dict) -> Path:
        return self.root / "cache" / kind / hash_value(key)[:20]

    def _intact(self, d: Path) -> bool:
        """A finished entry whose every file still has the hash recorded when it was built."""
        if d in self._verified:
            return True
        try:
            recorded = json.loads((d / DONE).read_text() or "null")
        except (OSError, ValueError):
            return False
        if not isinstance(recorded, dict) or recorded != _entry_hashes(d):
            return False
        self._verified.add(d)
        return True

    def file_hashes(self, d: Path, paths) -> dict[str, str]:
        """sha256 of each of ``paths`` (files inside the finished entry ``d``), by file name: the hash the entry's
        DONE record holds where this run wrote ``d`` or re-checked every file of it against that record
        (``_intact``), else read afresh (and a directory artifact always)."""
        recorded = json.loads((d / DONE).read_text() or "{}") if d in self._verified and (d / DONE).is_file() else {}
        return {p.name: recorded.get(Path(p).relative_to(d).as_posix()) or hash_file(p) for p in map(Path, paths)}

    def _evict(self, d: Path) -> None:
        self._verified.discard(d)
        self._remove(d)

    def cached(self, kind: str, key: dict) -> Path | None:
        d = self.step_dir(kind, key)
        return d if (d / DONE).exists() and self._intact(d) else None

    def run_step(self, kind: str, key: dict, build: Callable[[Path], None]) -> tuple[Path, bool]:
        """Return (directory, reused). ``build(tmp)`` writes the step's files; it runs only if no intact finished
        copy exists (a damaged copy is evicted first)."""
        d = self.step_dir(kind, key)
        if (d / DONE).exists() and self._intact(d):
            return d, True
        with self.writer(), atomic_dir(d) as tmp:  # a caller without the lock (e.g. `calibrate`) takes it here
            self._evict(d)
            build(tmp)
            (tmp / "key.json").write_text(json.dumps(key, indent=2, sort_keys=True, default=str))
            (tmp / DONE).write_text(json.dumps(_entry_hashes(tmp), indent=1))
        self._verified.add(d)
        return d, False

    # -- shelves ----------------------------------------------------------------------------------
    def shelf_dir(self, shelf: str, recipe: str, artifact_id: str) -> Path:
        assert shelf in SHELVES + (RETRACTED,)
        return self.root / shelf / recipe / artifact_id

    def place(self, shelf: str, recipe: str, artifact_id: str, files: dict[str, Path], manifest: dict) -> Path:
        """Put an artifact's files (private copies) and manifest on one shelf and take it off every other.

        The copy is assembled beside its destination; the artifact leaves its old shelf in one rename and arrives on
        the new one in one rename (an exchange when it was already there), so it is never on two shelves; a crash
        between the two leaves it on none, never stale on ``published``."""
        final = self.shelf_dir(shelf, recipe, artifact_id)

        def leave_other_shelves():
            for other in SHELVES + (RETRACTED,):
                if other != shelf:
                    self._remove(self.shelf_dir(other, recipe, artifact_id))

        with self.writer(), atomic_dir(final, before_replace=leave_other_shelves) as tmp:
            for name, src in files.items():
                dst = tmp / name
                dst.parent.mkdir(parents=True, exist_ok=True)
                clone_tree(Path(src), dst)
            (tmp / "manifest.json").write_text(dumps_json(manifest))
        return final

    @staticmethod
    def _remove(d: Path) -> None:
        """Take a directory away in one rename (readers see it or nothing), then delete it."""
        if d.exists():
            gone = temp_path(d)
            os.replace(d, gone)
            shutil.rmtree(gone, ignore_errors=True)
            with contextlib.suppress(OSError):  # an emptied recipe directory goes too
                d.parent.rmdir()

    def retract(self, recipe: str, artifact_ids, why: str) -> list[str]:
        """Take these artifacts off ``published`` (one rename each, to ``retracted/``) before they are rebuilt: if
        the rebuild does not finish, nothing from an earlier run stays published as passing. ``place`` clears the
        retracted copy when the rebuild lands."""
        moved = []
        for aid in artifact_ids:
            src = self.shelf_dir("published", recipe, aid)
            if not src.is_dir():
                continue
            dst = self.shelf_dir(RETRACTED, recipe, aid)
            try:
                dst.parent.mkdir(parents=True, exist_ok=True)
                self._remove(dst)
                os.replace(src, dst)
                write_json_atomic(dst / "retracted.json", {"reason": why})
            except OSError as e:
                raise io_error(e, dst) from None
            moved.append(aid)
        with contextlib.suppress(OSError):  # a recipe directory left empty on the shelf goes too
            self.shelf_dir("published", recipe, "x").parent.rmdir()
        return moved

    def manifests(self, shelves=SHELVES) -> Iterator[tuple[Path, dict]]:
        for shelf in shelves:
            for m in sorted((self.root / shelf).glob("*/*/manifest.json")):
                yield m.parent, json.loads(m.read_text())


__all__ = ["SHELF_OF", "SHELVES", "shelf_for", "Store", "StoreIOError", "atomic_dir", "read_json", "write_json_atomic", "write_text_atomic"]
