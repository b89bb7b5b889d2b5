"""The manifest every artifact directory carries (``manifest.json``), as a typed schema: the pipeline builds it
through ``Manifest`` (unknown keys are errors), readers may validate with ``Manifest.model_validate``, and
``docs/schemas/manifest.schema.json`` is its JSON Schema (``python -m omni_export.commands.schemas docs/schemas``;
a test keeps it current).

What the gate needs to re-judge an artifact from first principles is pinned here: ``recipe.hash`` (= ``recipe_hash``)
is the sha256 of the recipe, with its command-line overrides, that built the artifact (``Recipe.hash``: its
``to_dict()`` hashed by ``hashing.hash_value``; the run report under ``runs/<recipe>/`` holds that recipe, and so does
``recipes/<hash>.json`` in the store); ``thresholds`` are that recipe's thresholds for the artifact, under
``thresholds_key`` (``component/scheme`` or ``scheme``); ``parity.bounded_steps`` is the step budget the recipe asked
for (None: unbounded, every reference step), ``parity.asked_steps`` the steps a trace within it measures when every
call runs (``parity.gate.asked_steps``) and ``parity.metrics.steps`` what was measured.
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

SCHEMA = "omni-export/manifest/2"
Sha256 = Field(pattern=r"^[0-9a-f]{64}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FileEntry(_Strict):
    sha256: str = Sha256
    bytes: int = Field(ge=0)
    role: str  # the exporter's logical name: model, model.weights, context binary ...


class ArtifactInfo(_Strict):
    id: str
    component: dict                   # Component.describe(): name, kind, inputs, outputs, options
    format: str
    files: dict[str, FileEntry] = Field(min_length=1)
    export: dict                      # what the exporter recorded (Built.info)


class RecipeRef(_Strict):
    name: str
    hash: str = Sha256
    file: str                         # where the full recipe is kept in the store: recipes/<hash>.json


class TargetInfo(_Strict):
    name: str
    format: str
    device: Optional[dict] = None


class ParityInfo(_Strict):
    runtime: Optional[str]
    asked_steps: Optional[int]        # the steps a trace within the budget measures (parity.gate.asked_steps)
    bounded_steps: Optional[int]      # the simulator budget asked for (None: every reference step)
    reference: Optional[str]
    prompt_set: str
    metrics: Optional[dict]           # parity.metrics.compare(): steps, sequences, outputs, lm ...
    three_way_snr_db: Optional[dict] = None


class ThresholdEntry(_Strict):
    metric: str
    outputs: str = "*"
    min: Optional[float] = None
    max: Optional[float] = None
    reason: str
    min_positions: Optional[int] = None  # LM metrics: enforced on at least this many positions (parity.gate)

    @model_serializer(mode="wrap")
    def _bounds(self, handler):  # the bound that is not set is left out, as Threshold.to_dict writes it
        return {k: v for k, v in handler(self).items() if v is not None}


class Verdict(BaseModel):
    model_config = ConfigDict(extra="allow")  # gate-specific detail (local_status, ...) may be added by the gate
    status: Literal["pass", "blocked", "unverified"]
    reasons: list[str]
    checks: list[dict]


class Manifest(_Strict):
    schema_: Literal["omni-export/manifest/2"] = Field(SCHEMA, alias="schema")
    artifact: ArtifactInfo
    recipe: RecipeRef
    recipe_hash: str = Sha256
    model: dict                       # ModelBundle.provenance()
    scheme: dict                      # the whole Scheme, never a name inferred from a path
    calibration: Optional[dict]
    target: TargetInfo
    toolchain: dict                   # provenance.toolchain(): package versions
    source: dict                      # provenance.source_fingerprint(): hash of the package's code and data
    source_revision: dict             # provenance.git_revision()
    parity: ParityInfo
    thresholds_key: str
    thresholds: list[ThresholdEntry]
    verdict: Verdict
    created: str
    hub: Optional[dict] = None        # AI Hub results, when a device measured it (hub/)

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @model_validator(mode="after")
    def _pinned(self):
        if self.recipe_hash != self.recipe.hash:
            raise ValueError(f"recipe_hash {self.recipe_hash[:12]}… differs from recipe.hash {self.recipe.hash[:12]}…")
        return self

    def to_json(self) -> dict:
        return self.model_dump(mode="json", by_alias=True)


def json_schema() -> dict:
    return {"$id": SCHEMA, **Manifest.model_json_schema(by_alias=True)}
