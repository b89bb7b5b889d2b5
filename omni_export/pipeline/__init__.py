"""recipe -> model -> component -> calibration -> exporters -> runtimes -> parity -> gate -> store.

``Pipeline.run`` is a straight sequence of named stages: check (the whole recipe, before any work), take the store
(one writer), model and components (and every threshold against their outputs), pin the recipe, fp32 references,
calibration sets, then export + parity + a staged shelf copy per job, the family's end-to-end check, and at the end
the shelves and the run report. A run that fails anywhere leaves the shelves as the last finished run left them.
Finished steps are cached in the store under a key of everything that can change their result (``step_key``), so a
rerun resumes from where the last one stopped.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import fnmatch
import functools
import inspect
import json
from pathlib import Path

from rich.console import Console

from .. import memory
from ..artifacts.atomic import write_json_atomic
from ..artifacts.hashing import hash_value, path_bytes
from ..artifacts.manifest_schema import Manifest
from ..artifacts.provenance import git_revision, source_fingerprint, toolchain
from ..artifacts.store import Staged, Store, shelf_for
from ..calibration.dataset import CalibrationSet, select, validate, write_indexed_set
from ..components.base import Component, Sequence
from ..devices import get_device
from ..errors import BadInput, CheckpointError, RecipeError
from ..exporters import Built, ExportRequest, get_target
from ..families import build_model, get_family, load_prompt_set
from ..parity import gate
from ..parity.execute import execute
from ..recipes import Recipe, check_name, validate_options
from ..schemes import get_scheme
from .end_to_end import EndToEndContext
from .results import ArtifactResult, Plan, RunResult


SINKS_KEPT = " (attention sinks kept)"
PARITY_STEP = "parity"  # the step-cache kind of a parity measurement (``gate --rerun`` never copies it)


def build_id(b: Built) -> str:
    """What a cache key says of a build it depends on: its record, its files and its own step."""
    return hash_value(b.info | {"files": b.files, "dir": b.dir.name})


def calib_key(component: str, scheme) -> str:
    """The run's name for the calibration set a scheme of ``component`` uses."""
    return component + (SINKS_KEPT if scheme.calibrate_sinks else "")


def step_key(**parts) -> dict:
    """A cache key: the given inputs plus the package's own code and data and the toolchain's versions."""
    return {**parts, "source": source_fingerprint()["sha256"], "toolchain": toolchain()}


class Pipeline:
    def __init__(self, recipe: Recipe, store: Store, console: Console | None = None, require_verified: bool = False,
                 bundle=None):
        """``bundle``: the model an earlier run of the same ``recipe.model`` in this process built (a sweep's next
        scheme), used instead of building it again."""
        self.recipe, self.store = recipe, store
        self._given = (recipe.model, bundle) if bundle is not None else None
        self.console = console or Console(stderr=True)
        self.require_verified = require_verified
        self.wait_for_store = True  # a second run on the same store waits (saying so); False: exit 5 at once
        self.timings: dict[str, float] = {}
        self.peak_rss: dict[str, int] = {}  # bytes, per stage (the stage's own high-water mark on Linux)
        self._built: dict[tuple[str, str, str], Built] = {}
        self.components: dict = {}
        self.calibs: dict[str, CalibrationSet] = {}
        self._options: dict[str, dict] = {}
        self._reference_keys: dict[str, str] = {}  # component -> its fp32 reference step (a parity key names it)
        self._staged: list[Staged] = []  # this run's artifacts, assembled beside their shelves until the run ends

    # -- the stages, in order ----------------------------------------------------------------------
    def run(self) -> RunResult:
        plan = self.check()
        with self.store.writer(wait=self.wait_for_store, on_wait=self.console.log, sweep=False):
            comps = self.load_components(plan)  # a bad checkpoint fails here, before the store is touched
            self.check_thresholds(comps)
            self.store.sweep_temporaries()  # inputs valid: what a killed writer left goes now
            self.pin(plan)
            references = {name: self.reference(comp, plan) for name, comp in comps.items()}
            self.calibs = self.calibrations(comps, plan)
            self._staged = []
            try:
                results = [self.export_and_verify(comps[name], b, plan, references[name])
                           for name, b in self.recipe.jobs()]
                e2e = self.end_to_end(comps, results)
                self.shelve(results)
            finally:
                self.store.discard(self._staged)
            return self.finish(results, plan.device, self.calibs, e2e)

    def check(self) -> Plan:
        """Resolve and validate the whole recipe before any work: device, schemes, targets and what they support,
        prompt sets, component names and their options. Every failure is one ``RecipeError`` line."""
        r = self.recipe
        device = get_device(r.device)
        schemes = {b.scheme: get_scheme(b.scheme) for b in r.builds}
        targets = {b.target: get_target(b.target) for b in r.builds}
        for _, b in r.jobs():
            if b.scheme not in targets[b.target].schemes:
                raise RecipeError(f"recipe {r.name}: target {b.target} does not support scheme {b.scheme} "
                                  f"(supports {', '.join(targets[b.target].schemes)})")
        cal_prompts, par_prompts = load_prompt_set(r.prompts.calibration), load_prompt_set(r.prompts.parity)
        if r.parity.max_prompts is not None:
            par_prompts = dataclasses.replace(par_prompts, prompts=par_prompts.prompts[: r.parity.max_prompts])
        if overlap := set(cal_prompts.prompts) & set(par_prompts.prompts):
            raise BadInput(f"calibration and parity prompt sets share {len(overlap)} prompt(s): {sorted(overlap)[0]!r}")
        family = get_family(r.model.family)
        options = {}
        for name in r.components:
            factory = family.components.get(name)
            if factory is None:
                raise RecipeError(f"recipe {r.name}: components: model {r.model.family} has no component {name!r}; "
                                  f"known: {', '.join(family.components)}")
            options[name] = validate_options(factory, r.options.get(name, {}), f"recipe {r.name}: options.{name}")
        ids = {(c, b.target, b.scheme): f"{c}.{b.scheme}.{b.target}" +
               (f".{device.chipset.lower()}" if targets[b.target].device_specific else "") for c, b in r.jobs()}
        check_name(r.name, "recipe name")
        for aid in ids.values():
            check_name(aid, f"recipe {r.name}: artifact id")
        return Plan(device, schemes, targets, cal_prompts, par_prompts, options, ids)

    def check_thresholds(self, comps: dict) -> None:
        """Every output threshold of every job names at least one output of its component (the glob is checked
        here, once the components exist, not when the first artifact is judged)."""
        r = self.recipe
        for name, b in r.jobs():
            get_target(b.target).accepts(comps[name])  # a target that cannot build this component: one line, now
            outputs = [s.name for s in comps[name].output_specs()]
            for t in r.thresholds_for(name, b.scheme):
                if gate.metric(t.metric).kind == "output" and \
                        not any(fnmatch.fnmatchcase(o, t.outputs) for o in outputs):
                    raise RecipeError(f"recipe {r.name}: thresholds for {name}/{b.scheme}: {t.metric} on outputs "
                                      f"{t.outputs!r} matches no output of {name} ({', '.join(outputs[:6])}"
                                      f"{', ...' if len(outputs) > 6 else ''})")

    def pin(self, plan: Plan) -> None:
        """Keep the recipe the manifests will pin (``recipes/<hash>.json``). Earlier publications stay on their
        shelves until this run has finished and puts its own there (``shelve``)."""
        r = self.recipe
        write_json_atomic(self.store.root / "recipes" / f"{r.hash}.json", r.to_dict())

    def shelve(self, results: list[ArtifactResult]) -> None:
        """Put every artifact this run staged on its shelf (``Store.publish``), once the whole run has finished."""
        finals = self.store.publish(self._staged)
        by_dir = {st.dir: final for st, final in zip(self._staged, finals)}
        self._staged = []
        for a in results:
            a.shelf_dir = by_dir.get(a.shelf_dir, a.shelf_dir)

    def load_components(self, plan: Plan | None = None) -> dict:
        """Build the model (``self.bundle``) and the recipe's components, each with its validated options."""
        r = self.recipe
        plan = plan or self.check()
        with self._stage("model"):
            ckpt = Path(r.model.checkpoint) if r.model.checkpoint else None
            given = self._given is not None and self._given[0] == r.model
            self.bundle = self._given[1] if given else self._build_model(ckpt)
            comps = {}
            for name in r.components:
                comps[name] = self._component(name, plan.options[name])
        self.components, self._options = comps, plan.options
        return comps

    def _component(self, name: str, options: dict) -> Component:
        """The family's component ``name`` with its validated options, checked to be a ``Component`` (the contract
        every later stage calls): a class that misses part of it is one line naming what it misses."""
        r, factory = self.recipe, self.bundle.family.components[name]
        cls = getattr(factory, "func", factory)  # a class, or a functools.partial of one
        if isinstance(cls, type) and inspect.isabstract(cls):
            raise RecipeError(f"model {r.model.family}: component {name!r} ({cls.__name__}) does not implement "
                              f"{', '.join(sorted(cls.__abstractmethods__))} (components.base.Component)")
        try:
            comp = factory(self.bundle, context=r.context, **options)
        except (ValueError, TypeError) as e:
            raise RecipeError(f"recipe {r.name}: options.{name}: {e}") from None
        if not isinstance(comp, Component):
            raise RecipeError(f"model {r.model.family}: component {name!r} is a {type(comp).__name__}, not a "
                              "components.base.Component")
        return comp

    def _build_model(self, ckpt: Path | None):
        r = self.recipe
        try:
            return build_model(r.model.family, r.model.preset, r.model.seed, ckpt, weights_cache=self.store.root / "weights")
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
            if ckpt is None:  # a seeded model: a bug, not bad input
                raise
            raise CheckpointError(f"checkpoint {ckpt}: its config.json or weights do not describe a "
                                  f"{r.model.family} model: {type(e).__name__}: {str(e).splitlines()[0][:200]}") from None

    def reference(self, comp, plan: Plan) -> list[Sequence]:
        """The component's fp32 reference over the parity prompts (cached by content)."""
        r = self.recipe
        with self._stage(f"fp32 reference {comp.name}"):
            popts = {"max_prompt_tokens": r.prompts.max_prompt_tokens, "new_tokens": r.parity.new_tokens}
            key = step_key(**self._comp_key(comp), prompts=plan.par_prompts.hash, opts=popts)
            ref_dir, _ = self.store.run_step("reference", key,
                                             lambda d: self._write_reference(d, comp, plan.par_prompts, popts))
            self._reference_keys[comp.name] = ref_dir.name
            return [Sequence.load(p) for p in sorted(ref_dir.glob("seq_*.npz"))]

    def calibrations(self, comps: dict, plan: Plan) -> dict[str, CalibrationSet]:
        """A calibration set for each component that a calibrated quantized scheme of the recipe builds; a scheme
        that calibrates on the attention sinks too (``calibrate_sinks``, the naive build) gets a set of its own."""
        out = {}
        for c, b in self.recipe.jobs():
            s = plan.schemes[b.scheme]
            if s.quantized and s.calibrated and calib_key(c, s) not in out:
                out[calib_key(c, s)] = self.calibration_set(comps[c], plan.cal_prompts, keep_sinks=s.calibrate_sinks)
        return out

    def calibration_set(self, comp, cal_prompts, keep_sinks: bool = False) -> CalibrationSet:
        """The component's calibration set: captured from the fp32 pipeline once, then reused from the step cache."""
        r = self.recipe
        with self._stage(f"calibration {comp.name}" + (SINKS_KEPT if keep_sinks else "")):
            cap = comp.max_calibration_samples
            copts = {"max_prompt_tokens": r.prompts.max_prompt_tokens, "new_tokens": r.calibration.new_tokens,
                     "max_samples": r.calibration.max_samples if cap is None else min(cap, r.calibration.max_samples)}
            copts.update({"calibrate_sinks": True} if keep_sinks else {})
            key = step_key(**self._comp_key(comp), prompts=cal_prompts.hash, opts=copts)
            cdir, _ = self.store.run_step("calibration", key,
                                          lambda d: self._write_calibration(d, comp, cal_prompts, copts))
            cs = CalibrationSet.open(cdir)
            validate(cs, comp.input_specs())
        return cs

    def calibration_for(self, component: str, scheme) -> CalibrationSet | None:
        """The calibration set a build of ``component`` under ``scheme`` quantizes with (None if uncalibrated)."""
        return self.calibs.get(calib_key(component, scheme)) if scheme.quantized and scheme.calibrated else None

    def export_and_verify(self, comp, b, plan: Plan, reference) -> ArtifactResult:
        with self._stage(f"export {comp.name} {b.target}/{b.scheme}"):
            built = self.built(comp.name, b.target, b.scheme)
        with self._stage(f"parity {comp.name} {b.target}/{b.scheme}"):
            return self._verify(comp, built, plan.targets[b.target], plan.schemes[b.scheme], plan.device,
                                self.calibration_for(comp.name, plan.schemes[b.scheme]), reference, plan.artifact_ids[(comp.name, b.target, b.scheme)])

    def end_to_end(self, comps, results) -> dict | None:
        """The family's check over all artifacts (e.g. text -> audio), given an ``EndToEndContext``: the recipe, a
        runner per artifact of this run, the store's memo; not this pipeline."""
        if self.bundle.family.end_to_end is None:
            return None
        ctx = EndToEndContext(self.recipe, get_device(self.recipe.device), tuple(results), self.memo)
        with self._stage("end to end"):
            return self.bundle.family.end_to_end(ctx, comps, results)

    # -- building (dependencies through the one memo, no closures) --------------------------------
    def memo(self, kind: str, key: dict, build, comp=None) -> Path:
        """A finished step (``build(dir)`` writes it) keyed by ``key``, the model (with ``comp``: that component, its
        options) and the code: a family's ``end_to_end`` parts, an exporter's calibration pass (``ExportRequest``)."""
        ident = self._comp_key(comp) if comp else {"weights": self.bundle.weights_hash, "config": self.bundle.config_hash}
        return self.store.run_step(kind, step_key(**ident, **key), build)[0]

    def built(self, component: str, target: str, scheme: str) -> Built:
        """A component's build for (target, scheme): from this run's memo, the step cache, or the exporter."""
        k = (component, target, scheme)
        if k not in self._built:
            if component not in self.components:
                raise RecipeError(f"recipe {self.recipe.name}: a build needs component {component!r} too (list it in "
                                  "components)")
            self._built[k] = self._build(self.components[component], get_target(target), get_scheme(scheme))
        return self._built[k]

    def _build(self, comp, target, scheme) -> Built:
        r, device = self.recipe, get_device(self.recipe.device)
        calib = self.calibration_for(comp.name, scheme)
        key = step_key(**self._comp_key(comp), target=target.name, scheme=scheme.to_dict(),
                       device=device.to_dict() if target.device_specific else None,
                       calibration=calib.hash if calib is not None else None)
        thresholds, trace_set = tuple(r.thresholds_for(comp.name, scheme.name)), None
        if scheme.mixed:  # the search aims at the gate's thresholds on the calibration prompts: they decide the build
            topts = {"max_prompt_tokens": r.prompts.max_prompt_tokens, "new_tokens": r.calibration.new_tokens}
            cal_prompts = load_prompt_set(r.prompts.calibration)
            trace_set = (cal_prompts, topts)
            key["thresholds"] = [t.to_dict() for t in thresholds]
            key["search_prompts"] = {"prompts": cal_prompts.hash, "opts": topts}
        elif scheme.calibrated and scheme.static_activations and getattr(target, "calibrates_on_prompts", False):
            # genie: its prompt processor; onnx_genai w8a16: its one graph
            topts = {"max_prompt_tokens": r.prompts.max_prompt_tokens, "new_tokens": r.calibration.new_tokens}
            trace_set = (load_prompt_set(r.prompts.calibration), topts)
            key["calibration_prompts"] = {"prompts": trace_set[0].hash, "opts": topts}
        deps = [self.built(comp.name, t, s) for t, s in target.dependencies(scheme.name)]
        deps += [self.built(c, t, s) for c, t, s in target.peer_dependencies(comp, scheme.name)]
        key["deps"] = [build_id(dep) for dep in deps]
        source = functools.partial(self.built, comp.name)

        def build(out: Path):
            b = target.export(ExportRequest(comp, scheme, device, calib, source, thresholds, trace_set, self.built,
                                            functools.partial(self.memo, comp=comp)), out)
            (out / "built.json").write_text(json.dumps({"files": b.files, "info": b.info}, indent=2))

        d, _ = self.store.run_step(f"export-{target.name}", key, build)
        meta = json.loads((d / "built.json").read_text())
        return Built(target.name, scheme.name, d, meta["files"], meta["info"], deps)

    def _comp_key(self, comp) -> dict:
        tok = getattr(self.bundle, "tokenizer", None)  # prompts become other ids under another tokenizer
        return {"weights": self.bundle.weights_hash, "config": self.bundle.config_hash, "component": comp.describe(),
                "tokenizer": getattr(tok, "hash", None), "context": self.recipe.context,
                "options": self._options.get(comp.name, {})}

    def _write_reference(self, d: Path, comp, prompts, opts):
        for i, seq in enumerate(comp.reference(prompts, opts)):
            seq.save(d / f"seq_{i:03d}.npz")

    def _write_calibration(self, d: Path, comp, prompts, opts):
        keep = select(comp.calibration_steps(prompts, opts), opts["max_samples"])
        pools: dict = {}  # row pools a component may store inputs into (decode step: the KV rows, ``Rows``)
        write_indexed_set(d, comp.indexed_calibration_feeds(prompts, opts, keep, pools=pools), keep, prompts.name,
                          prompts.hash, pools)
        note = comp.calibration_note(prompts, opts)
        if note:  # what the capture left out (decode step: attention-sink positions) goes into the set's metadata
            idx = json.loads((d / "index.json").read_text())
            (d / "index.json").write_text(json.dumps({**idx, "excluded": note}, indent=2))

    # -- parity, verdict, shelf -------------------------------------------------------------------
    def _measure(self, comp, scheme, ex, built, reference, budget, files: dict) -> tuple[dict | None, dict, dict]:
        """(parity metrics, three-way SNR summary, verdict) for an artifact ``ex`` can execute. The measurement is a
        finished step keyed by every file executed (companions' builds too), runtimes, reference, budget, code and
        toolchain; the verdict is judged afresh each run. ``gate --rerun`` copies no parity step (docs/design.md)."""
        r = self.recipe
        key = step_key(**self._comp_key(comp), files=files, runtime=ex.runtime, companions=sorted(ex.companions),
                       deps=[build_id(d) for d in built.deps],
                       reference=self._reference_keys[comp.name], budget=budget)
        d, reused = self.store.run_step(PARITY_STEP, key,
                                        lambda out: write_json_atomic(out / "measured.json",
                                                                      execute(comp, ex, reference, budget, self.console)))
        if reused:
            self.console.log(f"parity {comp.name} on {ex.runtime}: the same files were measured before (reused)")
        measured = json.loads((d / "measured.json").read_text())
        parity, three_way = measured["parity"], measured["three_way"]
        if parity is None:  # a component's simulator budget of 0
            return None, {}, gate.unverified(
                f"{ex.runtime} completed no graph call within the simulator budget (recipe simulator_steps "
                f"{r.parity.simulator_steps}, {comp.name} options): nothing was measured")
        return parity, three_way, gate.judge(parity, list(r.thresholds_for(comp.name, scheme.name)),
                                             [s.name for s in comp.output_specs()], built.info.get("hidden_outputs"))

    def _verify(self, comp, built, target, scheme, device, calib, reference, artifact_id) -> ArtifactResult:
        r = self.recipe
        ex = target.execution(built, comp, device)
        budget = r.parity.simulator_steps if ex.bounded else None
        files = {name: built.dir / fn for name, fn in built.files.items()}
        hashes = self.store.file_hashes(built.dir, files.values())  # as this run built or re-checked them
        if ex.run is None:
            parity, three_way = None, {}
            verdict = gate.unverified(ex.unavailable or "no runtime on this machine can execute this artifact")
        else:
            parity, three_way, verdict = self._measure(comp, scheme, ex, built, reference, budget, hashes)
            if parity is not None and not ex.verified_on_target:
                verdict = gate.off_target(verdict, ex.note or f"{ex.runtime} is not the target's runtime")
        key = f"{comp.name}/{scheme.name}" if f"{comp.name}/{scheme.name}" in r.thresholds else scheme.name
        manifest = Manifest.model_validate({
            "artifact": {"id": artifact_id, "component": comp.describe(), "format": target.format,
                         "files": {p.name: {"sha256": hashes[p.name], "bytes": path_bytes(p), "role": name}
                                   for name, p in files.items()},
                         "export": built.info},
            "recipe": {"name": r.name, "hash": r.hash, "file": f"recipes/{r.hash}.json"}, "recipe_hash": r.hash,
            "model": self.bundle.provenance(), "scheme": scheme.to_dict(),
            "calibration": calib.provenance() if (calib is not None and scheme.quantized and scheme.calibrated) else None,
            "target": {"name": target.name, "format": target.format,
                       "device": device.to_dict() if target.device_specific else None},
            "toolchain": toolchain(), "source": source_fingerprint(), "source_revision": git_revision(),
            "parity": {"runtime": ex.runtime, "bounded_steps": budget,
                       "asked_steps": gate.asked_steps(comp, reference, budget),
                       "reference": comp.reference_note, "prompt_set": r.prompts.parity,
                       "metrics": parity, "three_way_snr_db": three_way or None},
            "thresholds_key": key, "thresholds": [t.to_dict() for t in r.thresholds_for(comp.name, scheme.name)],
            "verdict": verdict, "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }).to_json()
        staged = self.store.stage(shelf_for(verdict["status"]), r.name, artifact_id,
                                  {p.name: p for p in files.values()}, manifest)
        self._staged.append(staged)
        place = staged.dir  # until ``shelve`` puts it on its shelf
        size = sum(path_bytes(p) for p in files.values())
        return ArtifactResult(artifact_id, target.name, scheme.name, verdict["status"], verdict["reasons"], ex.runtime,
                              parity, place, verdict["checks"], three_way, size)

    # -- the run report ---------------------------------------------------------------------------
    def finish(self, results: list[ArtifactResult], device, calibs, e2e: dict | None = None) -> RunResult:
        from .run_report import write_run_report
        return write_run_report(self, results, device, calibs, e2e)

    def _stage(self, name: str):
        return memory.Stage(name, self.timings, self.peak_rss, self.console)
