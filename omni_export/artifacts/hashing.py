"""Content hashes for files, directories, tensors and plain values (sha256, hex)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

CHUNK = 1 << 20


def hash_bytes(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def hash_value(v) -> str:
    """Hash of a JSON-serialisable value, independent of key order."""
    return hash_bytes(json.dumps(v, sort_keys=True, separators=(",", ":"), default=str).encode())


def hash_file(path: Path) -> str:
    """sha256 of a file's bytes; for a directory artifact (e.g. an ``.mlpackage``), of its relative paths and file hashes."""
    if Path(path).is_dir():
        return hash_value({p.relative_to(path).as_posix(): hash_file(p) for p in sorted(Path(path).rglob("*")) if p.is_file()})
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def path_bytes(path: Path) -> int:
    """Size of a file, or of every file under a directory artifact."""
    p = Path(path)
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size


def hash_files(paths: dict[str, Path]) -> str:
    """Hash of named files: names and contents."""
    return hash_value({name: hash_file(p) for name, p in sorted(paths.items())})


def hash_tensors(tensors) -> str:
    """Hash of a mapping name -> tensor/array (name, dtype, shape and bytes), in sorted name order."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        a = t.detach().contiguous().cpu().numpy() if hasattr(t, "detach") else np.ascontiguousarray(t)
        h.update(f"{name}|{a.dtype}|{a.shape}|".encode())
        h.update(memoryview(a.reshape(-1).view(np.uint8)))
    return h.hexdigest()
