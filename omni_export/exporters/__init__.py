"""Exporters, one module per target format, listed in one explicit registry (a test keeps it in sync with the
modules). A target turns Component + Scheme (+ calibration set, + device) into artifact files, and says which
runtime on this machine can execute those files."""
from __future__ import annotations

import json
from typing import Callable

from ..errors import RecipeError
from .base import Built, Execution, ExportRequest, Target

__all__ = ["Built", "Execution", "ExportRequest", "Target", "get_target", "register_target", "registry", "reopen",
           "shelved", "unregister_target"]


_REGISTERED: dict[str, Target] = {}


def registry() -> dict[str, Target]:
    """Every target: the modules shipped here, then those added with ``register_target``."""
    from . import (adreno_gpu, coreml, executorch, executorch_coreml, executorch_llm, genie, onnx, onnx_genai, qdq_onnx,
                   qnn_context, qnn_context_shared)
    shipped = {t.name: t for t in (onnx.TARGET, qdq_onnx.TARGET, qnn_context.TARGET, qnn_context_shared.TARGET,
                                   executorch.TARGET, executorch_coreml.TARGET, coreml.TARGET, adreno_gpu.TARGET,
                                   genie.TARGET, executorch_llm.TARGET, onnx_genai.TARGET)}
    return {**shipped, **_REGISTERED}


def register_target(target: Target) -> Target:
    """Add a target defined outside this package; its schemes must be named in ``schemes``."""
    if target.name in registry():
        raise RecipeError(f"target {target.name!r} is already registered")
    _REGISTERED[target.name] = target
    return target


def unregister_target(name: str) -> None:
    """Remove a target added with ``register_target`` (shipped targets stay)."""
    _REGISTERED.pop(name, None)


def get_target(name: str) -> Target:
    reg = registry()
    if name not in reg:
        raise RecipeError(f"unknown target {name!r}; known: {', '.join(reg)}")
    return reg[name]


def shelved(result) -> Built:
    """The ``Built`` of a shelved artifact (``pipeline.ArtifactResult``), read back from its manifest."""
    m = json.loads((result.shelf_dir / "manifest.json").read_text())
    files = {meta["role"]: fn for fn, meta in m["artifact"]["files"].items()}
    return Built(result.target, result.scheme, result.shelf_dir, files, m["artifact"]["export"])


def reopen(result, component, device, results) -> Callable | None:
    """A runner over a shelved artifact with its target's runtime (None if no runtime here can execute it, or a
    dependency its runtime needs was not shelved by this run: ``results``, the run's other artifacts)."""
    built, target = shelved(result), get_target(result.target)
    for dt, ds in target.dependencies(result.scheme):
        dep = next((a for a in results if a.target == dt and a.scheme == ds
                    and a.artifact_id.startswith(component.name + ".")), None)
        if dep is not None:
            built.deps.append(shelved(dep))
    try:
        ex = target.execution(built, component, device)
    except IndexError:   # a companion runner needs a dependency that is not on a shelf
        return None
    return ex.run
