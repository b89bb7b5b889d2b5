"""Provenance: toolchain versions, a fingerprint of the package's own code and data, and the source revision. The
first two are part of every cache key (a change to either rebuilds what it could change) and of every manifest."""
from __future__ import annotations

import functools
import hashlib
import platform
import subprocess
from importlib import metadata
from pathlib import Path

PACKAGES = ("omni-export", "torch", "onnx", "onnxscript", "onnxruntime", "onnxruntime-qnn", "executorch",
            "coremltools", "torchao", "qai-hub", "safetensors", "numpy")


@functools.lru_cache(maxsize=1)
def toolchain() -> dict:
    out = {"python": platform.python_version(), "platform": f"{platform.system()}-{platform.machine()}"}
    for p in PACKAGES:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return out


PACKAGE_ROOT = Path(__file__).resolve().parents[1]
SOURCE_SUFFIXES = (".py", ".yaml", ".yml", ".txt", ".json", ".j2", ".html", ".css")  # code and package data


@functools.lru_cache(maxsize=4)
def _fingerprint(root: Path) -> tuple[str, int]:
    h, n = hashlib.sha256(), 0
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.suffix in SOURCE_SUFFIXES and "__pycache__" not in p.parts:
            h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
            n += 1
    return h.hexdigest(), n


def source_fingerprint() -> dict:
    """sha256 over every source and data file of the installed package (relative path and bytes, sorted): a one-line
    change to any model, component, exporter or prompt set changes it. Independent of where the checkout lives."""
    digest, n = _fingerprint(PACKAGE_ROOT)
    return {"sha256": digest, "files": n}


@functools.lru_cache(maxsize=1)
def git_revision() -> dict:
    """The git SHA of the omni-export source tree (``dirty`` when it has uncommitted changes), if it is a checkout."""
    src = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--", "omni_export"],
                               capture_output=True, text=True, timeout=10).stdout.strip() != ""
        return {"sha": sha, "dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        return {"sha": None, "dirty": None, "note": "not a git checkout (installed from a wheel)"}
