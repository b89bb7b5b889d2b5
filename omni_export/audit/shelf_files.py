"""Reading a store the gate judges: regular files only, each checked with ``lstat`` before it is opened (a symlink is
never followed, a FIFO or device never opened: the gate cannot hang on ``/dev/zero``), opened without following links
or blocking and checked again on the descriptor, and read up to a bound (a JSON file's ``MAX_JSON_BYTES``, a shipped
file's recorded size)."""
from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

from ..artifacts.hashing import CHUNK, hash_value

MAX_JSON_BYTES = 64 << 20  # a manifest, run report, kept recipe or baseline larger than this is refused unread


def _kind(mode: int) -> str:
    return next((k for f, k in ((stat.S_ISLNK, "a symlink"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                                (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                                (stat.S_ISSOCK, "a socket")) if f(mode)), "not a regular file")


def not_regular(path: Path) -> str | None:
    """Why ``path`` is not a regular file (``lstat``: a symlink is never followed), or None when it is one."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "is missing"
    except OSError as e:
        return f"cannot be read: {e.strerror or e}"
    return None if stat.S_ISREG(st.st_mode) else f"is {_kind(st.st_mode)}, not a regular file"


def _open_regular(path: Path) -> int:
    """A descriptor of ``path`` when it is a regular file: checked with ``lstat`` first, opened without following a
    symlink and without blocking (a FIFO), checked again on the descriptor. Raises ValueError saying why not."""
    why = not_regular(path)
    if why:
        raise ValueError(why)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise ValueError(f"cannot be opened: {e.strerror or e}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError("is not a regular file")
    return fd


def read_bounded(path: Path, limit: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (ValueError otherwise, saying why)."""
    fd = _open_regular(path)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise ValueError(f"has {size} bytes, more than the {limit} read")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise ValueError(f"grew past the {limit} bytes read")
        return data
    finally:
        os.close(fd)


def load_json(path: Path, limit: int = MAX_JSON_BYTES):
    """A JSON value from a regular file of at most ``limit`` bytes; ValueError (one line) for anything else: not
    regular, too large, not UTF-8, not JSON, nested too deeply to parse."""
    data = read_bounded(path, limit)
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError:
        raise ValueError("is nested too deeply to parse") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"is not UTF-8: {e}") from None


def _hash_regular(path: Path, size: int) -> str:
    """sha256 of a regular file known to have ``size`` bytes, reading at most that many."""
    fd = _open_regular(path)
    h = hashlib.sha256()
    try:
        with os.fdopen(os.dup(fd), "rb", buffering=0) as f:
            left = size
            while left > 0 and (chunk := f.read(min(CHUNK, left))):
                h.update(chunk)
                left -= len(chunk)
            if left or f.read(1):
                raise ValueError("changed size while it was read")
    finally:
        os.close(fd)
    return h.hexdigest()


def _tree(path: Path) -> tuple[dict[str, tuple[Path, int]], str | None]:
    """({relative path: (file, bytes)}, problem) of a directory artifact, every entry by ``lstat``: a symlink, FIFO
    or device anywhere inside is the problem."""
    files = {}
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        for n in sorted(dirnames + filenames):
            q = Path(dirpath) / n
            st = os.lstat(q)
            rel = q.relative_to(path).as_posix()
            if stat.S_ISDIR(st.st_mode):
                continue
            if not stat.S_ISREG(st.st_mode):
                return files, f"{rel} inside it is {_kind(st.st_mode)}, not a regular file"
            files[rel] = (q, st.st_size)
    return files, None


def file_problem(path: Path, meta: dict) -> str | None:
    """Why the shelf entry ``path`` is not the file (or directory tree) its manifest entry describes: not regular,
    another size (found without reading it), or another sha256 (reading at most the recorded bytes)."""
    name = path.name
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return f"{name} is missing"
    if stat.S_ISDIR(st.st_mode):  # a directory artifact (.mlpackage): a tree of relative paths and file hashes
        files, bad = _tree(path)
        if bad:
            return f"{name}: {bad}"
        size = sum(n for _, n in files.values())
        if size != meta["bytes"]:
            return f"{name} has {size} bytes, manifest says {meta['bytes']}"
        try:
            digest = hash_value({rel: _hash_regular(q, n) for rel, (q, n) in sorted(files.items())})
        except ValueError as e:
            return f"{name}: {e}"
    elif not stat.S_ISREG(st.st_mode):
        return f"{name} is {_kind(st.st_mode)}, not a regular file (only regular files ship)"
    elif st.st_size != meta["bytes"]:
        return f"{name} has {st.st_size} bytes, manifest says {meta['bytes']}"
    else:
        try:
            digest = _hash_regular(path, meta["bytes"])
        except ValueError as e:
            return f"{name} {e}"
    if digest != meta["sha256"]:
        return f"{name} was modified: sha256 {digest[:12]}… != manifest {meta['sha256'][:12]}…"
    return None
