"""The artifact store: a step cache keyed by input hashes, and published / blocked / unverified shelves.

Layout under the store root::

    cache/<kind>/<key>/             finished steps (``.done`` lists every file's sha256 and is written last)
    published/<recipe>/<artifact>/  artifacts that passed their parity gate, with manifest.json
    blocked/<recipe>/<artifact>/    artifacts the gate refused, with the reason in manifest.json; never published
    unverified/<recipe>/<artifact>/ artifacts no runtime here can execute; never published as passing
    runs/<recipe>/<stamp>/          the run's report (JSON and markdown)
    recipes/<hash>.json             the recipes manifests pin
    .lock                           held by the one run writing the store

Everything is written through ``atomic`` (temporary name beside the destination, fsync, rename), so a crash, a full
disk, Ctrl-C or SIGTERM never leaves a half-written step or artifact where a reader would find it. A cache entry is
re-hashed before every reuse, under the writer lock; a damaged one is evicted and rebuilt. A run stages its
artifacts (``stage``) and puts them on their shelves together once it has finished (``publish``): a run that fails
leaves the shelves as they were. Published files are private copies (reflinks where the filesystem has them) of the
cache's, never hard links: see docs/recipes.md "Store".
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from filelock import FileLock, Timeout

from ..errors import BadInput, StoreBusy, StoreIOError
from .atomic import (_fsync_dir, _fsync_tree, atomic_dir, clone_tree, dumps_json, io_error, replace_dir,
                     sweep_temporaries, temp_path, write_json_atomic, write_text_atomic)
from .hashing import hash_file, hash_many, hash_value
from .names import name_problem

SHELVES = ("published", "blocked", "unverified")
SHELF_OF = {"pass": "published", "blocked": "blocked", "unverified": "unverified"}  # THE verdict -> shelf map
RETRACTED = "retracted"  # where older stores kept a publication whose rebuild had started; cleared when it lands
DONE = ".done"
LOCK = ".lock"
# Where the store writes (and so where a killed writer can leave a ``.tmp-*`` entry): these directories of the root
# and their subdirectories. Nothing else under the root is the store's.
OWN_DIRS = ("cache", *SHELVES, RETRACTED, "runs", "recipes", "weights", "hub")

_locks: dict[str, FileLock] = {}
_thread_locks: dict[str, threading.RLock] = {}
_locks_guard = threading.Lock()


@dataclass
class Staged:
    """An artifact assembled beside its shelf directory (``dir``, a ``.tmp-*`` name), not yet on the shelf."""
    dir: Path
    shelf: str
    recipe: str
    artifact_id: str


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
    def _lock(self) -> tuple[threading.RLock, FileLock]:
        key = str(self.root.resolve())
        with _locks_guard:  # one lock pair per store in this process: a thread lock, and the file lock for processes
            if key not in _locks:
                _thread_locks[key] = threading.RLock()
                _locks[key] = FileLock(str(self.root / LOCK), thread_local=False)
            return _thread_locks[key], _locks[key]

    @contextlib.contextmanager
    def writer(self, wait: bool = True, on_wait: Callable[[str], None] | None = None,
               sweep: bool = True) -> Iterator["Store"]:
        """Hold the store's writer lock for the block (re-entrant in one thread; another thread or process waits).
        A second run waits (saying so once through ``on_wait``) or, with ``wait=False``, fails with one line. Whoever
        takes the lock first removes stale temporaries (``sweep_temporaries``); ``sweep=False`` leaves that to the
        holder (``Pipeline.run`` sweeps once its inputs are validated)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise io_error(e, self.root) from None
        tlock, lock = self._lock()
        msg = f"store {self.root} is being written by another omni-export run"
        if not tlock.acquire(blocking=False):
            if not wait:
                raise StoreBusy(f"{msg}; wait for it to finish or use another --store")
            if on_wait:
                on_wait(f"{msg}; waiting for it to finish")
            tlock.acquire()
        try:
            first = not lock.is_locked
            try:
                lock.acquire(timeout=0)
            except Timeout:
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
                    if sweep:
                        self.sweep_temporaries()
                yield self
            finally:
                lock.release()
        finally:
            tlock.release()

    def sweep_temporaries(self) -> list[Path]:
        """Remove the ``.tmp-*`` entries a killed writer left where the store writes (``OWN_DIRS``); only the holder
        of the writer lock calls this. Nothing outside those directories is touched."""
        removed = []
        for d in OWN_DIRS:
            if (self.root / d).is_dir() and not (self.root / d).is_symlink():
                removed += sweep_temporaries(self.root / d)
        return removed

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
        with self.writer():
            return d if (d / DONE).exists() and self._intact(d) else None

    def run_step(self, kind: str, key: dict, build: Callable[[Path], None]) -> tuple[Path, bool]:
        """Return (directory, reused). ``build(tmp)`` writes the step's files; it runs only if no intact finished
        copy exists (a damaged copy is evicted first). The check and the build are one step under the writer lock
        (a caller without it, e.g. `calibrate`, takes it here), so no other writer replaces the entry in between."""
        d = self.step_dir(kind, key)
        with self.writer():
            if (d / DONE).exists() and self._intact(d):
                return d, True
            with atomic_dir(d) as tmp:
                self._evict(d)
                build(tmp)
                (tmp / "key.json").write_text(json.dumps(key, indent=2, sort_keys=True, default=str))
                (tmp / DONE).write_text(json.dumps(_entry_hashes(tmp), indent=1))
            self._verified.add(d)
        return d, False

    # -- shelves ----------------------------------------------------------------------------------
    def shelf_dir(self, shelf: str, recipe: str, artifact_id: str) -> Path:
        assert shelf in SHELVES + (RETRACTED,)
        for what, name in (("recipe", recipe), ("artifact", artifact_id)):
            if (why := name_problem(name)) is not None:
                raise BadInput(f"{what} name {str(name)[:60]!r} {why}")
        return self.root / shelf / recipe / artifact_id

    def stage(self, shelf: str, recipe: str, artifact_id: str, files: dict[str, Path], manifest: dict) -> Staged:
        """Assemble an artifact's files (private copies) and manifest beside its shelf directory, synced, not yet
        on the shelf: ``publish`` puts it there, ``discard`` removes it. The caller holds the writer lock from here
        to ``publish`` (the next writer removes a staged copy as a stale temporary)."""
        final = self.shelf_dir(shelf, recipe, artifact_id)
        tmp = temp_path(final)
        with self.writer():
            try:
                final.parent.mkdir(parents=True, exist_ok=True)
                tmp.mkdir()
                for name, src in files.items():
                    dst = tmp / name
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    clone_tree(Path(src), dst)
                (tmp / "manifest.json").write_text(dumps_json(manifest))
                _fsync_tree(tmp)
            except OSError as e:
                shutil.rmtree(tmp, ignore_errors=True)
                raise io_error(e, final) from None
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        return Staged(tmp, shelf, recipe, artifact_id)

    def publish(self, staged: list[Staged]) -> list[Path]:
        """Put staged artifacts on their shelves, each taken off every other shelf first: it leaves its old shelf in
        one rename and arrives on the new one in one rename (an exchange when it was already there), so it is never
        on two shelves; a crash between the two leaves it on none, never stale on ``published``."""
        out = []
        with self.writer():
            for s in staged:
                final = self.shelf_dir(s.shelf, s.recipe, s.artifact_id)
                try:
                    for other in SHELVES + (RETRACTED,):
                        if other != s.shelf:
                            self._remove(self.shelf_dir(other, s.recipe, s.artifact_id))
                    replace_dir(s.dir, final)
                    _fsync_dir(final.parent)
                except OSError as e:
                    raise io_error(e, final) from None
                out.append(final)
        return out

    @staticmethod
    def discard(staged: list[Staged]) -> None:
        for s in staged:
            shutil.rmtree(s.dir, ignore_errors=True)

    def place(self, shelf: str, recipe: str, artifact_id: str, files: dict[str, Path], manifest: dict) -> Path:
        """Put one artifact's files (private copies) and manifest on one shelf and take it off every other
        (``stage`` then ``publish``)."""
        with self.writer():  # one hold: a first ``writer`` entry in between would sweep the staged copy
            staged = self.stage(shelf, recipe, artifact_id, files, manifest)
            try:
                return self.publish([staged])[0]
            finally:
                self.discard([staged])

    @staticmethod
    def _remove(d: Path) -> None:
        """Take a directory away in one rename (readers see it or nothing), then delete it."""
        if d.exists():
            gone = temp_path(d)
            os.replace(d, gone)
            shutil.rmtree(gone, ignore_errors=True)
            with contextlib.suppress(OSError):  # an emptied recipe directory goes too
                d.parent.rmdir()

    def manifests(self, shelves=SHELVES) -> Iterator[tuple[Path, dict]]:
        for shelf in shelves:
            for m in sorted((self.root / shelf).glob("*/*/manifest.json")):
                yield m.parent, json.loads(m.read_text())


__all__ = ["SHELF_OF", "SHELVES", "Staged", "shelf_for", "Store", "StoreIOError", "atomic_dir", "read_json", "write_json_atomic", "write_text_atomic"]
