"""What a family's end-to-end check gets from the run: ``Family.end_to_end(context, components, results)`` receives an
``EndToEndContext`` (the recipe, a runner per artifact of this run, the store's memo of finished steps), never the
``Pipeline`` itself."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..components.base import Component, Runner
from ..exporters import reopen
from ..recipes import Recipe
from .results import ArtifactResult


@dataclass(frozen=True)
class EndToEndContext:
    recipe: Recipe
    device: object                            # the recipe's device (``devices.get_device``)
    results: tuple[ArtifactResult, ...]       # this run's artifacts, as ``runner`` re-opens them
    steps: Callable[[str, dict, Callable[[Path], None]], Path]  # ``Pipeline.memo`` for the model (no component)

    def runner(self, comp: Component, result: ArtifactResult) -> Runner | None:
        """A runner over ``result``'s shelved artifact (a build of ``comp`` in this run), or None if none runs here."""
        return reopen(result, comp, self.device, list(self.results))

    @staticmethod
    def budget(result: ArtifactResult) -> int | None:
        """The graph calls ``result``'s parity was bounded to (its manifest's ``parity.bounded_steps``: the recipe's
        ``simulator_steps`` on a slow simulator), or None where its runtime is not bounded."""
        return json.loads((result.shelf_dir / "manifest.json").read_text())["parity"]["bounded_steps"]

    def memo(self, kind: str, key: dict, build: Callable[[Path], None]) -> Path:
        """A finished step of the store (``build(dir)`` writes it), keyed by ``key``, the model and the code: run once
        per key, read back by every later run."""
        return self.steps(kind, key, build)
