"""Provenance: toolchain versions and the source revision, recorded in every manifest."""
from __future__ import annotations

import functools
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
