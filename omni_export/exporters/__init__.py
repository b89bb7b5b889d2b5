"""Exporters, one module per target format, listed in one explicit registry (a test keeps it in sync with the
modules). A target turns Component + Scheme (+ calibration set, + device) into artifact files, and says which
runtime on this machine can execute those files."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import RecipeError


@dataclass
class Built:
    """A finished export: the files that ship and what the exporter recorded about them."""
    target: str
    scheme: str
    dir: Path
    files: dict[str, str]               # logical name -> file name inside dir
    info: dict = field(default_factory=dict)
    deps: list["Built"] = field(default_factory=list)  # the built dependencies, attached by the pipeline

    def path(self, name: str = "model") -> Path:
        return self.dir / self.files[name]


@dataclass
class ExportRequest:
    component: object                   # components.base.Component
    scheme: object                      # schemes.Scheme
    device: object                      # devices.Device
    calibration: object | None          # calibration.store.CalibrationSet, for calibrated schemes
    source: Callable[[str, str], Built]  # (target, scheme) -> a dependency, built or taken from the cache
    thresholds: tuple = ()             # the gate's thresholds for this component and scheme (mixed precision aims at them)
    trace_set: tuple | None = None     # (calibration PromptSet, opts): prompts mixed precision measures candidates on
    peer: Callable[[str, str, str], Built] | None = None  # (component, target, scheme) -> another component's build


@dataclass
class Execution:
    """How parity is measured for an artifact here: the runtime that executes the shipping file, or why none can."""
    runtime: str | None
    run: Callable | None = None
    unavailable: str | None = None
    companions: dict[str, Callable] = field(default_factory=dict)  # extra runners for three-way comparisons
    bounded: bool = False              # slow simulator: run a bounded number of steps
    verified_on_target: bool = True    # False: ``run`` is a local stand-in for the target's runtime (a pass -> unverified)
    note: str | None = None            # why the stand-in is not the target, recorded in the verdict


class Target:
    name: str = ""
    format: str = ""
    schemes: tuple[str, ...] = ()
    device_specific: bool = False
    version: str = "1"                 # bump when the export changes, so cached steps are rebuilt

    def dependencies(self, scheme: str) -> list[tuple[str, str]]:
        return []

    def peer_dependencies(self, component, scheme: str) -> list[tuple[str, str, str]]:
        """Builds of other components of the recipe this export needs: (component, target, scheme)."""
        return []

    def export(self, req: ExportRequest, out: Path) -> Built:
        raise NotImplementedError

    def execution(self, built: Built, component, device) -> Execution:
        raise NotImplementedError


def registry() -> dict[str, Target]:
    from . import adreno_gpu, coreml, executorch_pte, onnx_cpu, qdq_onnx, qnn_context, qnn_shared
    return {t.name: t for t in (onnx_cpu.TARGET, qdq_onnx.TARGET, qnn_context.TARGET, qnn_shared.TARGET,
                                executorch_pte.TARGET, executorch_pte.COREML_TARGET, coreml.TARGET, adreno_gpu.TARGET)}


def get_target(name: str) -> Target:
    reg = registry()
    if name not in reg:
        raise RecipeError(f"unknown target {name!r}; known: {', '.join(reg)}")
    return reg[name]
