"""The job ledger: which AI Hub jobs were submitted for which artifact, so a rerun finds them instead of resubmitting.

One JSON file in the store (``hub/ledger.json``), keyed by ``<artifact sha256>|<device>|<kind>``; every entry keeps
the spec it was submitted with (options, inputs hash), and an entry whose spec differs is not reused. The file is
rewritten atomically after every submission, so an interrupted run leaves every job it submitted findable.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..artifacts.store import write_json_atomic
from ..errors import StoreIOError

SCHEMA = "omni-export/hub-ledger/1"


class Ledger:
    def __init__(self, store_root: Path):
        self.path = Path(store_root) / "hub" / "ledger.json"
        self.entries: dict[str, dict] = {}
        if self.path.exists():
            try:
                data = json.loads(self.path.read_text())
            except (OSError, ValueError) as e:
                raise StoreIOError(f"cannot read the AI Hub job ledger {self.path}: {e}") from None
            self.entries = dict(data.get("entries", {}))

    @staticmethod
    def key(sha256: str, device: str, kind: str) -> str:
        return f"{sha256}|{device}|{kind}"

    def find(self, sha256: str, device: str, kind: str, spec: dict) -> dict | None:
        e = self.entries.get(self.key(sha256, device, kind))
        return e if e is not None and e.get("spec") == spec else None

    def record(self, sha256: str, device: str, kind: str, spec: dict, **fields) -> dict:
        entry = {"spec": spec, **fields}
        self.entries[self.key(sha256, device, kind)] = entry
        write_json_atomic(self.path, {"schema": SCHEMA, "entries": self.entries})
        return entry
