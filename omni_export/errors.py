"""Typed errors and the exit codes every command shares (docs/exit-codes.md mirrors this table)."""
from __future__ import annotations

EXIT_OK = 0
EXIT_BLOCKED = 1          # the parity gate blocked something the command was asked to produce or check
EXIT_BAD_INPUT = 2        # malformed recipe, checkpoint, calibration data, prompts or command line
EXIT_MISSING_DEP = 3      # a package or runtime the request needs is not installed / cannot start here
EXIT_UNSUPPORTED = 4      # the graph or scheme cannot be lowered to the requested target
EXIT_IO = 5               # the filesystem refused: disk full, permissions, read-only store
EXIT_HUB = 6              # Qualcomm AI Hub: missing credentials, a failed job, the service unreachable
EXIT_EXPECTATION = 7      # a recipe that expects its artifacts blocked (expect_blocked) produced a passing one
EXIT_INTERNAL = 70        # a bug in omni-export (an unexpected exception)


class OmniError(Exception):
    """An error with a one-line message that names the input at fault."""

    exit_code = EXIT_INTERNAL
    kind = "error"

    def __str__(self):  # keep it one line
        return " ".join(str(a) for a in self.args).replace("\n", " ")


class BadInput(OmniError):
    exit_code, kind = EXIT_BAD_INPUT, "bad input"


class RecipeError(BadInput):
    kind = "recipe"


class CheckpointError(BadInput):
    kind = "checkpoint"


class CalibrationError(BadInput):
    kind = "calibration"


class MissingDependency(OmniError):
    exit_code, kind = EXIT_MISSING_DEP, "missing dependency"


class UnsupportedError(OmniError):
    exit_code, kind = EXIT_UNSUPPORTED, "unsupported"


class StoreIOError(OmniError):
    exit_code, kind = EXIT_IO, "io"


class HubError(OmniError):
    exit_code, kind = EXIT_HUB, "ai hub"


class StoreBusy(StoreIOError):
    kind = "store in use"


def is_disk_full(e: BaseException | None) -> bool:
    """True when ``e``, or an exception it was raised from or during, is the filesystem saying it is full (ENOSPC or
    EDQUOT), however a library wrapped it (onnx and protobuf raise RuntimeError with the OS message)."""
    import errno

    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(e) or "Disk quota exceeded" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def os_error_in(e: BaseException | None) -> OSError | None:
    """The first ``OSError`` in ``e``'s chain (``e`` itself, or what it was raised from or during), else None: a
    failed read or write however a library wrapped it. Some report a short write as an ``OSError`` without an errno
    (numpy's ``tofile``: "131072 requested and 82688 written")."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError):
            return e
        e = e.__cause__ or e.__context__
    return None


LOW_SPACE_BYTES = 1 << 20  # a failed write where less than this is left counts as a full disk


def write_failure(e: BaseException, path) -> StoreIOError | None:
    """The ``StoreIOError`` (exit 5) for ``e`` raised while writing ``path``, when ``e`` is the filesystem refusing
    (a full disk, ENOSPC or EIO or a short write, in ``e``'s chain); None when it is not an I/O failure."""
    import os

    err = os_error_in(e)
    if err is None and not is_disk_full(e):
        return None
    try:
        st = os.statvfs(os.path.dirname(os.fspath(path)) or ".")
        low = st.f_bavail * st.f_frsize < LOW_SPACE_BYTES
    except OSError:
        low = False
    if is_disk_full(e) or low:
        return StoreIOError(f"disk full while writing {path}; nothing was left half-written")
    return StoreIOError(f"cannot write {path}: {err.strerror or err}")
