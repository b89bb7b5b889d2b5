"""What a run resolves and produces: the ``Plan`` ``Pipeline.check`` makes before any work, each artifact's
``ArtifactResult`` and the run's ``RunResult``."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ArtifactResult:
    artifact_id: str
    target: str
    scheme: str
    status: str
    reasons: list[str]
    runtime: str | None
    parity: dict | None
    shelf_dir: Path
    checks: list = field(default_factory=list)
    three_way: dict = field(default_factory=dict)
    size_bytes: int = 0


@dataclass
class RunResult:
    recipe: str
    artifacts: list[ArtifactResult]
    report_dir: Path
    exit_code: int
    timings: dict


@dataclass(frozen=True)
class Plan:
    """What ``check`` resolved from the recipe: every name looked up, every option validated, nothing built yet."""
    device: object
    schemes: dict
    targets: dict
    cal_prompts: object
    par_prompts: object
    options: dict          # component -> its validated factory options (the one form that reaches it)
    artifact_ids: dict     # (component, target, scheme) -> artifact id
