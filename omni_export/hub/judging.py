"""Judging what AI Hub measured: the device's outputs against the fp32 outputs for the same inputs, with the
thresholds of the recipe the artifact's manifest pins (never a newer copy of the recipe), and the artifact placed
on the shelf its combined verdict belongs on (``Store.place``): a failed compile job or a failing on-device parity
moves it to ``blocked`` exactly like a local failure.

The manifest keeps the local verdict as ``verdict.local`` and the combined one (local + every device) as
``verdict``; each device's section is ``hub.<device>``. The gate recomputes all of them from the figures.
"""
from __future__ import annotations

import datetime as _dt

from ..artifacts.store import Store, shelf_for
from ..parity import gate
from ..parity.metrics import compare

PARITY_MODE = {
    "teacher-forced": "teacher-forced per step: graph inputs of N teacher-forced steps of the eager fp32 run (caches "
                      "fed from the fp32 run; per sequence the steps whose logits predict the greedy tokens), sent as "
                      "one inference dataset; device outputs vs the fp32 outputs for the same inputs",
    "per-call": "per graph call: the graph inputs of the component's host loop driven by the eager fp32 graph, sent "
                "as one inference dataset; device outputs vs the fp32 graph's outputs for the same inputs",
}


def device_verdict(pi, trace, comp, pinned, scheme: str) -> dict:
    """(the parity section and the verdict) of an inference job's trace, judged with the pinned recipe."""
    parity = compare(pi.reference, trace, pi.mode == "teacher-forced")
    thresholds = list(pinned.thresholds_for(comp.name, scheme))
    unmeasured = gate.unmeasured_in(pi.mode)
    measured = [t for t in thresholds if t.metric not in unmeasured]
    verdict = gate.judge(parity, measured, [s.name for s in comp.output_specs()]) if measured else \
        {"status": gate.BLOCKED, "reasons": ["no threshold of the pinned recipe is measurable on the device"],
         "checks": []}
    return {"parity": {"mode": PARITY_MODE[pi.mode], "mode_key": pi.mode, "steps": sum(pi.steps),
                       "sequences": len(pi.steps), "prompt_set": pinned.prompts.parity, "metrics": parity,
                       "not_measured": {t.metric: unmeasured[t.metric] for t in thresholds if t.metric in unmeasured}},
            "thresholds": [t.to_dict() for t in measured], "verdict": verdict,
            "recipe_hash": pinned.hash}


def failed_compile(job_ref: dict, reason: str) -> dict:
    """The section of a compile job the service failed: the artifact is blocked with the job's own reason."""
    return {"compile": {**job_ref, "failure": reason},
            "verdict": {"status": gate.BLOCKED, "reasons": [f"AI Hub compile job {job_ref['job_id']} failed: {reason}"],
                        "checks": []}}


def combined_verdict(local: dict, hub: dict) -> dict:
    """The artifact's verdict: the local one, plus every device's on-device verdict. Any block blocks."""
    statuses = [local["status"]] + [h["verdict"]["status"] for h in hub.values()]
    reasons, checks = list(local["reasons"]), list(local["checks"])
    for dev, h in hub.items():
        reasons += [f"on-device ({dev}, AI Hub): {r}" for r in h["verdict"]["reasons"]]
        checks += [{**c, "where": f"ai-hub {dev}"} for c in h["verdict"]["checks"]]
    status = max(statuses, key=(gate.PASS, gate.UNVERIFIED, gate.BLOCKED).index)
    return {"status": status, "reasons": reasons, "checks": checks, "local": local}


def place_with_hub(store: Store, recipe: str, a, device_key: str, section: dict):
    m = dict(a.manifest)
    local = m["verdict"].get("local") or m["verdict"]
    m["hub"] = {**(m.get("hub") or {}), device_key: {**section, "created": _now()}}
    m["verdict"] = combined_verdict(local, m["hub"])
    files = {fn: a.dir / fn for fn in a.files}
    location = store.place(shelf_for(m["verdict"]["status"]), recipe, a.id, files, m)
    return location, m["verdict"]["status"], m["verdict"]["reasons"]


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
