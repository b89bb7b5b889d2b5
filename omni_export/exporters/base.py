"""What every target is and returns: ``Target`` (export + execution), ``ExportRequest``, ``Built``, ``Execution``."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol

from ..runtimes import lazy
from ..runtimes.ort import ort_cpu, require_ort

if TYPE_CHECKING:
    from ..calibration.dataset import CalibrationSet
    from ..components.base import Component
    from ..devices import Device
    from ..schemes import Scheme


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


class SourceBuild(Protocol):
    def __call__(self, target: str, scheme: str) -> Built:
        """A dependency of this component (e.g. the fp32 ONNX graph a QDQ graph is made from), built or taken from
        the store's cache."""


class PeerBuild(Protocol):
    def __call__(self, component: str, target: str, scheme: str) -> Built:
        """Another component's build of the same recipe (e.g. the decode step's binary a shared context joins)."""


class StepMemo(Protocol):
    def __call__(self, kind: str, key: dict, build: Callable[[Path], None]) -> Path:
        """A finished step of the store: ``build(dir)`` writes its files once, keyed by ``key`` plus this component,
        its model and options, and the code (e.g. a calibration pass two schemes share: ``quantize.qdq``)."""


@dataclass
class ExportRequest:
    """What the pipeline hands a target: the component and scheme to export, for which device, with what
    calibration; the gate's thresholds; and three ways back into the store (``source``, ``peer``, ``memo``), each a
    typed callable, so a target never sees the pipeline itself."""
    component: Component
    scheme: Scheme
    device: Device
    calibration: CalibrationSet | None  # for calibrated schemes
    source: SourceBuild
    thresholds: tuple = ()             # the gate's thresholds for this component and scheme (mixed precision aims at them)
    trace_set: tuple | None = None     # (calibration PromptSet, opts): prompts mixed precision measures candidates on
    peer: PeerBuild | None = None
    memo: StepMemo | None = None


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
    # per graph of a chain, a factory of its runner: parity may then hold one graph's session at a time
    # (``parity.execute.part_major``); ``run`` must then make its sessions lazily too
    parts: dict[str, Callable[[], Callable]] | None = None
    companion_parts: dict[str, dict[str, Callable[[], Callable]]] = field(default_factory=dict)  # the same, per companion
    # the target's own runtime where it takes a prompt, not a step (Genie): ``generate(prompts' ids, n_new per
    # prompt) -> {"ids", "logits", "refused"}``; parity's free-running figures then come from it, the teacher-forced
    # ones from ``run`` (``parity.execute.generated``)
    generate: Callable | None = None
    # a program that keeps its caches inside (an LLM runner's): ``trace(reference, budget) -> sequences`` of the
    # outputs it exposes, in place of the component's trace over ``run`` (its export records why the others are not
    # observable as ``hidden_outputs``: the gate records their thresholds as skipped with that reason)
    trace: Callable | None = None


class Target:
    name: str = ""
    format: str = ""
    schemes: tuple[str, ...] = ()
    device_specific: bool = False

    def dependencies(self, scheme: str) -> list[tuple[str, str]]:
        return []

    def peer_dependencies(self, component, scheme: str) -> list[tuple[str, str, str]]:
        """Builds of other components of the recipe this export needs: (component, target, scheme)."""
        return []

    def accepts(self, component) -> None:
        """Raise a one-line ``UnsupportedError`` when this target cannot build ``component`` (checked before any
        export); every component by default."""

    def export(self, req: ExportRequest, out: Path) -> Built:
        raise NotImplementedError

    def execution(self, built: Built, component, device) -> Execution:
        raise NotImplementedError


def lazy_chain(component, factories: dict[str, Callable[[], Callable]]) -> tuple[Callable, dict | None]:
    """(``component.chain`` over runners made at their first call, the factories for ``Execution.parts`` when the
    component has several graphs, else None)."""
    return component.chain({n: lazy(f) for n, f in factories.items()}), (factories if len(factories) > 1 else None)


def foldable(built, graph: str) -> bool:
    """Whether CPU parity may dequantize ``graph``'s weights once without checking (``runtimes.ort.cpu_session``): a
    graph with float nodes left in it may not, since onnxruntime's default session can fuse across those where the
    basic level does not; its folded session serves only once it has matched the default one (``verified_fold``)."""
    return graph not in (built.info.get("float_nodes") or {})


def qdq_chain(built, component):
    """``(run, parts)`` of a QDQ build on ORT CPU (``lazy_chain``): the chain's sessions are made at their first call;
    ``parts`` (a chain of several graphs) make sessions that are open alone, so their weights are folded at any size.
    A component of one graph is alone in its chain too (Gemma 3 270M's decode step, 466 MB of weight files:
    ``runtimes.ort.verified_fold``)."""
    require_ort()
    outs = {g.name: [s.name for s in g.outputs] for g in component.graphs()}

    def sessions(alone: bool) -> dict:
        return {n: functools.partial(ort_cpu, built.path(n), o, qdq=True, verify=not foldable(built, n), alone=alone)
                for n, o in outs.items()}
    run, parts = lazy_chain(component, sessions(len(outs) == 1))
    return run, (sessions(True) if parts else None)
