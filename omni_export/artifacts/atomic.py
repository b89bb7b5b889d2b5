"""The one atomic writer of the package: every file and directory omni-export writes goes through here.

A file is written into a private temporary file beside its destination (``.tmp-<name>-<random>``), flushed to disk
(fsync) and renamed over the destination; a directory likewise, with every file in it fsynced first. A crash, a full
disk, Ctrl-C or SIGTERM therefore never leaves a half-written file where a reader would look; what it can leave is a
``.tmp-*`` entry, which ``sweep_temporaries`` removes when the next writer takes the store.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Callable, Iterator

from ..errors import StoreIOError, write_failure

TMP_PREFIX = ".tmp-"
TMP_NAME = re.compile(r"\.tmp-.+-[0-9a-f]{8}")  # what ``temp_path`` makes: prefix, the destination's name, 8 hex


def io_error(e: OSError, what: Path) -> StoreIOError:
    """One line for a write the filesystem refused: "disk full" when it says so or has less than
    ``errors.LOW_SPACE_BYTES`` left (a short write carries no errno), else its own reason."""
    return write_failure(e, what) or StoreIOError(f"cannot write {what}: {e.strerror or e}")


def temp_path(final: Path) -> Path:
    return final.parent / f"{TMP_PREFIX}{final.name}-{uuid.uuid4().hex[:8]}"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            with open(p, "rb") as f:
                os.fsync(f.fileno())


def write_bytes_atomic(path: Path, data: bytes) -> None:
    path = Path(path)
    tmp = temp_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise io_error(e, path) from None
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def dumps_json(value) -> str:
    return json.dumps(value, indent=2, default=str) + "\n"


def write_json_atomic(path: Path, value) -> None:
    write_text_atomic(path, dumps_json(value))


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def replace_dir(tmp: Path, final: Path) -> None:
    """Put directory ``tmp`` at ``final``: one rename when ``final`` is absent, one atomic exchange when it exists
    (readers see the old directory or the new one, never neither); the old one is then removed."""
    if not final.exists():
        os.replace(tmp, final)
        return
    if _exchange(tmp, final):
        shutil.rmtree(tmp, ignore_errors=True)  # ``tmp`` now holds the old directory
        return
    old = final.parent / f"{TMP_PREFIX}old-{final.name}-{uuid.uuid4().hex[:8]}"
    os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def atomic_dir(final: Path, before_replace: Callable[[], None] | None = None) -> Iterator[Path]:
    """Yield a fresh temporary directory; on success it replaces ``final`` atomically, on failure it vanishes.
    ``before_replace`` runs once the directory is complete and synced, just before the rename."""
    final = Path(final)
    tmp = temp_path(final)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
    except OSError as e:
        raise io_error(e, final) from None
    try:
        yield tmp
        _fsync_tree(tmp)
        if before_replace is not None:
            before_replace()
        replace_dir(tmp, final)
        _fsync_dir(final.parent)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise io_error(e, final) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def sweep_temporaries(root: Path) -> list[Path]:
    """Remove every temporary file or directory ``temp_path`` names (``.tmp-<name>-<8 hex>``) under ``root``, left by
    a killed writer; return what was removed. Only the holder of the store's writer lock calls this (on the store's
    own directories, ``Store.sweep_temporaries``), so no live writer owns them. Symbolic links are not followed."""
    removed = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [n for n in dirnames if TMP_NAME.fullmatch(n)]:
            p = Path(dirpath) / name
            if p.is_symlink():
                with contextlib.suppress(OSError):
                    p.unlink()
            else:
                shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
            dirnames.remove(name)
        for name in filenames:
            if TMP_NAME.fullmatch(name):
                with contextlib.suppress(OSError):
                    (Path(dirpath) / name).unlink()
                removed.append(Path(dirpath) / name)
    return removed


DIRECT_COPY_MIN = 64 << 20  # files at least this large are byte-copied with O_DIRECT writes (``_copy_direct``)
_DIRECT_CHUNK = 8 << 20
_DIRECT_ALIGN = 4096


def clone_file(src: Path, dst: Path) -> None:
    """A private copy of ``src`` at ``dst``: a reflink (copy-on-write, no extra blocks) where the filesystem has
    them (btrfs, xfs), else a byte copy. Never a hard link: editing one must not change the other."""
    import fcntl

    with open(src, "rb") as fi, open(dst, "wb") as fo:
        try:
            fcntl.ioctl(fo.fileno(), 0x40049409, fi.fileno())  # FICLONE
            return
        except OSError:
            pass
    if os.path.getsize(src) >= DIRECT_COPY_MIN and _copy_direct(Path(src), Path(dst)):
        return
    shutil.copyfile(src, dst)  # in-kernel copy (sendfile) on Linux


def _copy_direct(src: Path, dst: Path) -> bool:
    """Byte-copy ``src`` to ``dst`` writing around the page cache (O_DIRECT, the last partial block written normally);
    False where the filesystem refuses O_DIRECT (nothing written then). A buffered copy of a shelf's gigabytes
    filled the page cache with pages nobody reads again, evicting the cache entries the next steps read, and then
    waited for them all in ``atomic_dir``'s fsync; written directly, the bytes go to the disk once, at its speed
    (full-size Spark: 23.6 GB of shelf copies a run)."""
    import mmap

    if not getattr(os, "O_DIRECT", 0):  # not Linux
        return False
    try:
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o666)
    except OSError:
        return False
    buf = mmap.mmap(-1, _DIRECT_CHUNK)  # page-aligned, as O_DIRECT needs
    view, done = memoryview(buf), 0
    try:
        with open(src, "rb", buffering=0) as fi:
            while True:
                n = fi.readinto(view)
                if not n:
                    break
                whole = n - n % _DIRECT_ALIGN
                try:
                    off = 0
                    while off < whole:
                        off += os.write(fd, view[off:whole])
                except OSError as e:
                    if done == 0 and e.errno == errno.EINVAL:  # O_DIRECT accepted at open, refused at write
                        return False
                    raise
                done += whole
                if whole < n:  # the end of the file (or a short read): the rest through the page cache
                    os.close(fd)
                    fd = -1
                    with open(dst, "r+b") as fo:
                        fo.seek(done)
                        fo.write(view[whole:n])
                        shutil.copyfileobj(fi, fo)
                    break
    finally:
        view.release()
        buf.close()
        if fd >= 0:
            os.close(fd)
    return True


def clone_tree(src: Path, dst: Path) -> None:
    if Path(src).is_dir():
        shutil.copytree(src, dst, copy_function=lambda s, d: clone_file(Path(s), Path(d)))
    else:
        clone_file(Path(src), Path(dst))
