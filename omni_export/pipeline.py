"""recipe -> model -> component -> calibration -> exporters -> runtimes -> parity -> gate -> store.

Each stage hands the next a small plain value; finished steps are cached in the store by the hash of their inputs,
so a rerun resumes from where the last one stopped.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from . import __version__, memory
from .artifacts.hashing import hash_file, hash_value, path_bytes
from .artifacts.provenance import git_revision, toolchain
from .artifacts.store import Store, write_json_atomic
from .calibration.dataset import CalibrationSet, select, validate, write_indexed_set
from .calibration.prompts import load_prompt_set
from .components.base import Sequence
from .devices import get_device
from .errors import EXIT_BLOCKED, EXIT_OK, BadInput, RecipeError
from .exporters import Built, ExportRequest, get_target
from .models import build_model
from .parity import gate
from .parity.metrics import compare
from .recipes import Recipe
from .schemes import get_scheme

MANIFEST_SCHEMA = "omni-export/manifest/1"


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


class Pipeline:
    def __init__(self, recipe: Recipe, store: Store, console: Console | None = None, require_verified: bool = False):
        self.recipe, self.store = recipe, store
        self.console = console or Console(stderr=True)
        self.require_verified = require_verified
        self.timings: dict[str, float] = {}
        self.peak_rss: dict[str, int] = {}  # bytes, per stage (the stage's own high-water mark on Linux)

    # -- helpers ---------------------------------------------------------------------------------
    def _stage(self, name: str):
        pipeline = self

        class _T:
            def __enter__(self):
                memory.reset_peak()
                self.t = time.perf_counter()
                self.status = pipeline.console.status(f"[bold]{name}[/]…")
                self.status.__enter__()

            def __exit__(self, *exc):
                self.status.__exit__(*exc)
                dt = time.perf_counter() - self.t
                pipeline.timings[name] = round(pipeline.timings.get(name, 0.0) + dt, 3)
                pipeline.peak_rss[name] = max(pipeline.peak_rss.get(name, 0), memory.peak_rss_bytes())
                if exc[0] is None:
                    pipeline.console.log(f"{name}: {dt:.1f} s")

        return _T()

    def _progress(self):
        return Progress(TextColumn("  {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=self.console, transient=True)

    def _counted(self, run, prog, task):
        def wrapped(feed):
            out = run(feed)
            prog.advance(task)
            return out
        return wrapped

    # -- stages ----------------------------------------------------------------------------------
    def run(self) -> RunResult:
        r = self.recipe
        device = get_device(r.device)
        schemes = {b.scheme: get_scheme(b.scheme) for b in r.builds}
        targets = {b.target: get_target(b.target) for b in r.builds}
        for _, b in r.jobs():
            if b.scheme not in targets[b.target].schemes:
                raise RecipeError(f"recipe {r.name}: target {b.target} does not support scheme {b.scheme} "
                                  f"(supports {', '.join(targets[b.target].schemes)})")
        cal_prompts = load_prompt_set(r.prompts.calibration)
        par_prompts = load_prompt_set(r.prompts.parity)
        if r.parity.max_prompts is not None:
            par_prompts = dataclasses.replace(par_prompts, prompts=par_prompts.prompts[: r.parity.max_prompts])
        overlap = set(cal_prompts.prompts) & set(par_prompts.prompts)
        if overlap:
            raise BadInput(f"calibration and parity prompt sets share {len(overlap)} prompt(s): {sorted(overlap)[0]!r}")

        comps = self.load_components()

        references, calibs = {}, {}
        for name, comp in comps.items():
            comp_key = self._comp_key(comp)
            with self._stage(f"fp32 reference {name}"):
                popts = {"max_prompt_tokens": r.prompts.max_prompt_tokens, "new_tokens": r.parity.new_tokens}
                ref_dir, _ = self.store.run_step("reference", {**comp_key, "prompts": par_prompts.hash, "opts": popts},
                                                 lambda d: self._write_reference(d, comp, par_prompts, popts))
                references[name] = [Sequence.load(p) for p in sorted(ref_dir.glob("seq_*.npz"))]
            if any(schemes[b.scheme].quantized and schemes[b.scheme].calibrated for c, b in r.jobs() if c == name):
                calibs[name] = self.calibration_set(comp, cal_prompts)

        built_cache: dict[tuple[str, str, str], Built] = {}

        def source_for(comp):
            def source(target_name: str, scheme_name: str) -> Built:
                k = (comp.name, target_name, scheme_name)
                if k not in built_cache:
                    built_cache[k] = self._build(comp, get_target(target_name), get_scheme(scheme_name), device,
                                                 calibs.get(comp.name), source, cal_prompts, peer)
                return built_cache[k]
            return source

        def peer(name: str, target_name: str, scheme_name: str) -> Built:
            if name not in comps:
                raise RecipeError(f"recipe {r.name}: a build needs component {name!r} too (list it in components)")
            return source_for(comps[name])(target_name, scheme_name)

        results = []
        for name, b in r.jobs():
            comp = comps[name]
            with self._stage(f"export {name} {b.target}/{b.scheme}"):
                built = source_for(comp)(b.target, b.scheme)
            with self._stage(f"parity {name} {b.target}/{b.scheme}"):
                results.append(self._verify(comp, built, targets[b.target], schemes[b.scheme], device,
                                            calibs.get(name), references[name]))
        self.components = comps
        e2e = None
        if self.bundle.family.end_to_end is not None:  # family-level check over all artifacts, e.g. text -> audio
            with self._stage("end to end"):
                e2e = self.bundle.family.end_to_end(self, comps, results)
        return self._finish(results, device, calibs, e2e)

    def load_components(self) -> dict:
        """Build the model (``self.bundle``) and the recipe's components."""
        r = self.recipe
        with self._stage("model"):
            ckpt = Path(r.model.checkpoint) if r.model.checkpoint else None
            self.bundle = build_model(r.model.family, r.model.preset, r.model.seed, ckpt,
                                      weights_cache=self.store.root / "weights")
            comps = {}
            for name in r.components:
                factory = self.bundle.family.components.get(name)
                if factory is None:
                    raise RecipeError(f"model {r.model.family} has no component {name!r}; "
                                      f"known: {', '.join(self.bundle.family.components)}")
                try:
                    comps[name] = factory(self.bundle, context=r.context, **r.options.get(name, {}))
                except (ValueError, TypeError) as e:
                    raise RecipeError(f"recipe {r.name}: {e}") from None
        return comps

    def calibration_set(self, comp, cal_prompts) -> CalibrationSet:
        """The component's calibration set: captured from the fp32 pipeline once, then reused from the step cache."""
        r = self.recipe
        with self._stage(f"calibration {comp.name}"):
            cap = comp.max_calibration_samples
            copts = {"max_prompt_tokens": r.prompts.max_prompt_tokens, "new_tokens": r.calibration.new_tokens,
                     "max_samples": r.calibration.max_samples if cap is None else min(cap, r.calibration.max_samples)}
            cdir, _ = self.store.run_step("calibration", {**self._comp_key(comp), "prompts": cal_prompts.hash,
                                                          "opts": copts},
                                          lambda d: self._write_calibration(d, comp, cal_prompts, copts))
            cs = CalibrationSet.open(cdir)
            validate(cs, comp.input_specs())
        return cs

    def _write_reference(self, d: Path, comp, prompts, opts):
        for i, seq in enumerate(comp.reference(prompts, opts)):
            seq.save(d / f"seq_{i:03d}.npz")

    def _write_calibration(self, d: Path, comp, prompts, opts):
        keep = select(comp.calibration_steps(prompts, opts), opts["max_samples"])
        write_indexed_set(d, comp.indexed_calibration_feeds(prompts, opts, keep), keep, prompts.name, prompts.hash)

    def _comp_key(self, comp) -> dict:
        return {"weights": self.bundle.weights_hash, "config": self.bundle.config_hash, "component": comp.describe()}

    def _build(self, comp, target, scheme, device, calib, source, cal_prompts=None, peer=None) -> Built:
        key = {**self._comp_key(comp), "target": target.name, "target_version": target.version, "scheme": scheme.to_dict(),
               "omni_export": __version__}
        if target.device_specific:
            key["device"] = device.to_dict()
        if scheme.quantized and scheme.calibrated:
            key["calibration"] = calib.hash
        thresholds, trace_set = tuple(self.recipe.thresholds_for(comp.name, scheme.name)), None
        if scheme.mixed:  # the search aims at the gate's thresholds on the calibration prompts: they decide the build
            topts = {"max_prompt_tokens": self.recipe.prompts.max_prompt_tokens,
                     "new_tokens": self.recipe.calibration.new_tokens}
            trace_set = (cal_prompts, topts)
            key["thresholds"] = [t.to_dict() for t in thresholds]
            key["search_prompts"] = {"prompts": cal_prompts.hash, "opts": topts}
        deps = [source(t, s) for t, s in target.dependencies(scheme.name)]
        deps += [peer(c, t, s) for c, t, s in target.peer_dependencies(comp, scheme.name)]
        key["deps"] = [hash_value(dep.info | {"files": dep.files, "dir": dep.dir.name}) for dep in deps]

        def build(out: Path):
            b = target.export(ExportRequest(comp, scheme, device, calib, source, thresholds, trace_set, peer), out)
            (out / "built.json").write_text(json.dumps({"files": b.files, "info": b.info}, indent=2))

        d, _ = self.store.run_step(f"export-{target.name}", key, build)
        meta = json.loads((d / "built.json").read_text())
        return Built(target.name, scheme.name, d, meta["files"], meta["info"], deps)

    def _trace(self, comp, run, reference, budget, label):
        total = sum(len(s.tokens) for s in reference) * (2 if comp.kind == "lm" else 1)
        total = total if budget is None else min(total, budget)
        prog = self._progress()
        with prog:
            task = prog.add_task(label, total=total)
            return comp.trace(self._counted(run, prog, task), reference, budget)

    def _verify(self, comp, built, target, scheme, device, calib, reference) -> ArtifactResult:
        r = self.recipe
        artifact_id = f"{comp.name}.{scheme.name}.{target.name}" + (f".{device.chipset.lower()}" if target.device_specific else "")
        ex = target.execution(built, comp, device)
        three_way, parity = {}, None
        if ex.run is None:
            verdict = gate.unverified(ex.unavailable or "no runtime on this machine can execute this artifact")
        else:
            budget = r.parity.simulator_steps if ex.bounded else None
            trace = self._trace(comp, ex.run, reference, budget, f"{ex.runtime}")
        if ex.run is not None and not any(t.outputs for t in trace):  # a component's simulator budget of 0
            verdict = gate.unverified(f"{ex.runtime} completed no graph call within the simulator budget (recipe "
                                      f"simulator_steps {r.parity.simulator_steps}, {comp.name} options): nothing "
                                      "was measured")
        elif ex.run is not None:
            parity = compare(reference, trace, comp.kind == "lm", audio=comp.kind == "audio")
            for cname, crun in ex.companions.items():
                ctrace = self._trace(comp, crun, reference, budget, cname)
                three_way[f"fp32 vs {cname}"] = _snr_summary(compare(reference, ctrace, comp.kind == "lm",
                                                                     audio=comp.kind == "audio"))
                three_way[f"{cname} vs {ex.runtime}"] = _snr_summary(compare(ctrace, trace, False))
                three_way[f"fp32 vs {ex.runtime}"] = _snr_summary(parity)
            verdict = gate.judge(parity, list(r.thresholds_for(comp.name, scheme.name)),
                                 [s.name for s in comp.output_specs()])
            if not ex.verified_on_target:
                verdict = gate.off_target(verdict, ex.note or f"{ex.runtime} is not the target's runtime")
        files = {name: built.dir / fn for name, fn in built.files.items()}
        manifest = {
            "schema": MANIFEST_SCHEMA,
            "artifact": {"id": artifact_id, "component": comp.describe(), "format": target.format,
                         "files": {fn: {"sha256": hash_file(p), "bytes": path_bytes(p), "role": name}
                                   for name, p in files.items() for fn in [p.name]},
                         "export": built.info},
            "recipe": {"name": r.name, "hash": r.hash},
            "model": self.bundle.provenance(),
            "scheme": scheme.to_dict(),
            "calibration": calib.provenance() if (calib is not None and scheme.quantized and scheme.calibrated) else None,
            "target": {"name": target.name, "format": target.format,
                       "device": device.to_dict() if target.device_specific else None},
            "toolchain": toolchain(),
            "source_revision": git_revision(),
            "parity": {"runtime": ex.runtime, "bounded_steps": r.parity.simulator_steps if ex.bounded else None,
                       "reference": comp.reference_note, "prompt_set": r.prompts.parity,
                       "metrics": parity, "three_way_snr_db": three_way or None},
            "thresholds": [t.to_dict() for t in r.thresholds_for(comp.name, scheme.name)],
            "verdict": verdict,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }
        shelf = {"pass": "published", "blocked": "blocked", "unverified": "unverified"}[verdict["status"]]
        place = self.store.place(shelf, r.name, artifact_id, {p.name: p for p in files.values()}, manifest)
        size = sum(path_bytes(p) for p in files.values())
        return ArtifactResult(artifact_id, target.name, scheme.name, verdict["status"], verdict["reasons"], ex.runtime,
                              parity, place, verdict["checks"], three_way, size)

    def _finish(self, results: list[ArtifactResult], device, calibs, e2e: dict | None = None) -> RunResult:
        r = self.recipe
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        bad = [a for a in results if a.status == gate.BLOCKED or (self.require_verified and a.status == gate.UNVERIFIED)]
        code = EXIT_BLOCKED if bad else EXIT_OK
        report = {
            "recipe": r.to_dict(), "device": device.to_dict(), "model": self.bundle.provenance(),
            "calibration": {k: c.provenance() for k, c in calibs.items()} or None, "timings_s": self.timings,
            "peak_rss_bytes": self.peak_rss,
            "exit_code": code, "created": stamp,
            "artifacts": [{"id": a.artifact_id, "target": a.target, "scheme": a.scheme, "status": a.status,
                           "reasons": a.reasons, "runtime": a.runtime, "parity": a.parity, "checks": a.checks,
                           "three_way_snr_db": a.three_way or None, "size_bytes": a.size_bytes,
                           "location": str(a.shelf_dir.relative_to(self.store.root))} for a in results],
        }
        out = self.store.root / "runs" / r.name / stamp
        if e2e is not None:  # a family's files for a person (e.g. .wav) go next to the report
            writer = e2e.pop("write_files", None)
            report["end_to_end"] = {**e2e, "files": writer(out)} if writer else e2e
        write_json_atomic(out / "report.json", report)
        from .parity.report import markdown_summary
        (out / "report.md").write_text(markdown_summary(report))
        write_json_atomic(self.store.root / "runs" / r.name / "latest.json", report)
        return RunResult(r.name, results, out, code, self.timings)


def _snr_summary(parity: dict) -> dict:
    outs = parity["outputs"]
    kv = [v["snr_db"] for k, v in outs.items() if k != "logits"]
    s = {"logits": outs["logits"]["snr_db"]} if "logits" in outs else {}
    if kv:
        s["kv_rows_min"] = min(kv)
    return s
