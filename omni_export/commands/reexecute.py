"""``omni-export gate --reexecute``: the published files run again on their runtimes, nothing rebuilt, and every
figure compared with the manifest's. It sits beside the command modules, above both the pipeline (whose stages it
reuses) and the audit (whose result it adds to): the audit itself never builds a model.

A forger who swaps two artifacts' files and their manifests' hashes, or replaces a file with another valid graph and
rewrites its sha256 and size, passes every static check; executing the files shows it. For each published artifact
whose files are exactly its manifest's, the recipe CI trusts under its name (``audit.trust``, replayed with the pinned
command-line overrides; an untrusted recipe's own pin otherwise) is resolved by the pipeline's own stages
(``Pipeline.check``, ``load_components``, ``reference``): the model is built from the recipe and the fp32 reference is
computed afresh in a private scratch store, never read from the audited store's cache. The shelved files are then
opened by their target exactly as the run opened them (``Target.execution`` over a ``Built`` read back from the
manifest, its dependencies from the same shelf) and traced by ``parity.execute.execute`` within the recipe's budget;
the three-way companions are left out (they produce no gated figure). The figures must equal the manifest's: the
runtimes here are deterministic, so any difference means the files are not the ones that were measured.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
import time
from pathlib import Path

from ..audit.ci_gate import Case, GateResult
from ..audit.gate_store import Entry, Runs, verify_files
from ..audit.trust import Trust, overrides_of
from ..errors import OmniError

TOLERANCE = 1e-9  # relative: figures go through the same code and JSON both times; only a float's last bits may move


def _numbers(v, key: str = "") -> dict:
    if isinstance(v, dict):
        return {k2: x for k, sub in v.items() for k2, x in _numbers(sub, f"{key}.{k}" if key else str(k)).items()}
    if isinstance(v, list):
        return {k2: x for i, sub in enumerate(v) for k2, x in _numbers(sub, f"{key}[{i}]").items()}
    return {key: v}


def differing(stored: dict | None, again: dict | None) -> list[str]:
    """Every figure of ``parity.metrics`` that differs between the manifest and the re-execution."""
    a, b = _numbers(stored or {}), _numbers(json.loads(json.dumps(again)) if again is not None else {})
    from ..parity.metric_specs import names

    judged = names()
    out = []
    for k in sorted(set(a) | set(b), key=lambda k: (k.rsplit(".", 1)[-1] not in judged, k)):  # gated figures first
        x, y = a.get(k), b.get(k)
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and not isinstance(x, bool) \
                and abs(x - y) <= TOLERANCE * max(abs(x), abs(y), 1.0):
            continue
        if x != y:
            out.append(f"{k} {x!r} in the manifest, {y!r} re-executed")
    return out


def _recipe(name: str, pin: str, runs: Runs, trust: Trust):
    pinned, where = runs.pinned(name, pin)
    if name in trust.recipes:
        trusted, twhere = trust.recipes[name]
        return (trusted.with_overrides(**overrides_of(pinned)) if pinned is not None else trusted), twhere
    return pinned, where


def reexecute(root: Path, res: GateResult, entries: list[Entry], trust: Trust, console) -> dict:
    """Add a ``reexecute`` case to every published artifact of ``res``; returns a summary for the gate's JSON."""
    from ..artifacts.store import Store
    from ..exporters import Built, get_target
    from ..parity.execute import execute
    from ..pipeline import Pipeline

    started, runs = time.monotonic(), Runs(root)
    by_key = {f"{e.recipe}/{e.dir.name}": e for e in entries}
    checks = {a.key: a for a in res.artifacts}
    todo = [a for a in res.artifacts if a.shelf == "published"]
    groups: dict[tuple[str, str], list] = {}
    for a in todo:
        e = by_key.get(a.key)
        if e is None or e.manifest is None:
            continue  # its manifest case already fails
        if verify_files(e.dir, e.manifest):
            a.cases.append(Case("reexecute", "fail", "not re-executed: its files are not the manifest's (see files)"))
            continue
        groups.setdefault((a.recipe, e.manifest["recipe"]["hash"]), []).append((a, e))
    done = 0
    scratch = Path(tempfile.mkdtemp(prefix="omni-export-reexecute-"))
    try:
        for (name, pin), items in sorted(groups.items()):
            try:
                r, where = _recipe(name, pin, runs, trust)
            except OmniError as err:
                r, where = None, str(err)
            if r is None:
                for a, _ in items:
                    a.cases.append(Case("reexecute", "fail", f"not re-executed: no recipe to run it with ({where})"))
                continue
            try:
                pl = Pipeline(r, Store(scratch / f"{len(list(scratch.iterdir()))}"), console)
                plan = pl.check()
                comps = pl.load_components(plan)
            except OmniError as err:
                for a, _ in items:
                    a.cases.append(Case("reexecute", "fail", f"not re-executed: recipe {name} ({where}): {err}"))
                continue
            job_of = {aid: key for key, aid in plan.artifact_ids.items()}
            references = {}
            for a, e in items:
                key = job_of.get(a.artifact_id)
                if key is None:
                    a.cases.append(Case("reexecute", "fail", f"recipe {name} ({where}) builds no artifact {a.artifact_id}"))
                    continue
                comp_name, target_name, scheme = key
                comp, target = comps[comp_name], get_target(target_name)
                try:
                    if comp_name not in references:
                        references[comp_name] = pl.reference(comp, plan)
                    built = _shelved(e, target_name, scheme, Built)
                    for dt, ds in target.dependencies(scheme):
                        dep = by_key.get(f"{name}/{plan.artifact_ids.get((comp_name, dt, ds))}")
                        dep_check = checks.get(f"{name}/{plan.artifact_ids.get((comp_name, dt, ds))}")
                        if dep is None or dep.manifest is None or verify_files(dep.dir, dep.manifest) or \
                                dep_check is None:
                            raise ValueError(f"its dependency {dt}/{ds} is not intact in the store")
                        built.deps.append(_shelved(dep, dt, ds, Built))
                    ex = target.execution(built, comp, plan.device)
                    if ex.run is None:
                        a.cases.append(Case("reexecute", "skipped", f"no runtime here: {ex.unavailable}"))
                        continue
                    ex = dataclasses.replace(ex, companions={}, companion_parts={})
                    budget = r.parity.simulator_steps if ex.bounded else None
                    again = execute(comp, ex, references[comp_name], budget, console)["parity"]
                except (OmniError, ValueError, RuntimeError, IndexError, KeyError, TypeError, OSError) as err:
                    first = str(err).splitlines()[0][:200] if str(err) else ""
                    a.cases.append(Case("reexecute", "fail", f"the shelved files do not execute as "
                                                             f"{target_name}/{scheme} of {comp_name}: "
                                                             f"{type(err).__name__}: {first}"))
                    continue
                moved = differing(e.manifest["parity"].get("metrics"), again)
                done += 1
                a.cases.append(Case("reexecute", "fail" if moved else "pass",
                                    (f"{len(moved)} figure(s) differ from the manifest's: " + "; ".join(moved[:3]))
                                    if moved else f"re-executed on {ex.runtime} against a fresh fp32 reference: "
                                                  "every figure equals the manifest's"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {"artifacts": done, "seconds": round(time.monotonic() - started, 1)}


def _shelved(e: Entry, target: str, scheme: str, built_cls):
    """The ``Built`` of a shelf directory read back from its (validated) manifest: the files the run executed."""
    m = e.manifest
    files = {meta["role"]: fn for fn, meta in m["artifact"]["files"].items()}
    return built_cls(target, scheme, e.dir, files, m["artifact"]["export"])
