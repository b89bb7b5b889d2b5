"""What is sent to AI Hub: which stored artifacts, the jobs planned for them, the files staged for upload, the
recipe that built them (pinned by their manifests) with its components built by the pipeline's own loader, and the
inference dataset of recorded graph inputs with the fp32 outputs for exactly those inputs.

Two ways to record the parity inputs (``parity.gate.unmeasured_in`` says what each cannot measure):

- ``teacher-forced`` (LM steps with ``run_tokens``): the graph inputs of teacher-forced steps of the eager fp32 host
  loop, the caches fed from the fp32 run; per sequence the steps whose logits predict the reference's greedy tokens;
- ``per-call`` (any other component): the graph inputs of the component's own host loop (``trace``) driven by the
  eager fp32 graph within the step budget, and that graph's outputs for each call (one sequence of calls).
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..artifacts.hashing import hash_file, hash_tensors, hash_value
from ..artifacts.store import SHELVES, Store
from ..families import load_prompt_set
from ..components.base import Sequence
from ..devices import get_device
from ..errors import BadInput, HubError, RecipeError, UnsupportedError
from ..audit.gate_store import Runs

# Stored targets AI Hub can take as the source of an NPU compile, and why. A new source is one line here.
SOURCES = {
    "qdq_onnx": "the QDQ ONNX graph; AI Hub keeps its calibrated quantization when it compiles for the HTP",
}
TARGET_RUNTIMES = ("qnn_context_binary", "qnn_dlc")


@dataclass(frozen=True)
class HubDevice:
    key: str            # how the manifest and ledger name it: omni-export's device name, or the service's name
    hub_name: str       # the name AI Hub lists
    chipset: str | None


def resolve_device(name: str) -> HubDevice:
    """omni-export's devices by name or chipset (galaxy_s25, SM8650, ...); any other name is taken as the service's
    own name, and checked against its device list before anything is uploaded."""
    try:
        d = get_device(name)
    except RecipeError:
        return HubDevice(name, name, None)
    return HubDevice(d.name, d.hub_name, d.chipset)


@dataclass
class StoredArtifact:
    id: str
    dir: Path
    shelf: str
    manifest: dict

    @property
    def files(self) -> dict[str, dict]:
        return self.manifest["artifact"]["files"]

    @property
    def sha256(self) -> str:
        """The artifact's identity for the ledger: the hashes of every file that ships."""
        return hash_value({fn: f["sha256"] for fn, f in self.files.items()})

    @property
    def target(self) -> str:
        return self.manifest["target"]["name"]

    @property
    def component(self) -> str:
        return self.manifest["artifact"]["component"]["name"]


@dataclass(frozen=True)
class Options:
    target_runtime: str = "qnn_context_binary"
    qairt_version: str | None = None
    steps: int | None = None          # steps sent to the device (default: the pinned recipe's parity budget)
    poll_seconds: float = 10.0
    timeout_seconds: float = 3 * 3600.0

    def compile_options(self) -> str:
        return " ".join([f"--target_runtime {self.target_runtime}"] + self._qairt())

    def run_options(self) -> str:
        return " ".join(self._qairt())

    def _qairt(self) -> list[str]:
        return [f"--qairt_version {self.qairt_version}"] if self.qairt_version else []


@dataclass
class PlannedJob:
    kind: str           # upload | compile | profile | inference
    artifact: str
    device: str
    options: str
    what: str
    found: str | None = None   # the id the ledger already has for it


def select_artifacts(store: Store, recipe: str, ids: list[str] | None) -> list[StoredArtifact]:
    found = {}
    for shelf in SHELVES:
        for m in sorted((store.root / shelf / recipe).glob("*/manifest.json")):
            found[m.parent.name] = StoredArtifact(m.parent.name, m.parent, shelf, json.loads(m.read_text()))
    if not found:
        raise BadInput(f"no artifacts of recipe {recipe!r} in the store {store.root}; run `omni-export recipe {recipe}` first")
    if ids:
        missing = [i for i in ids if i not in found]
        if missing:
            raise BadInput(f"artifact {missing[0]!r} not in the store for recipe {recipe}; stored: {', '.join(found)}")
        chosen = [found[i] for i in ids]
        for a in chosen:
            if a.target not in SOURCES:
                raise UnsupportedError(f"artifact {a.id} (target {a.target}) cannot be sent to AI Hub; "
                                       f"sources: {', '.join(SOURCES)}")
    else:
        chosen = [a for a in found.values() if a.target in SOURCES and a.shelf == "published"]
        if not chosen:
            raise BadInput(f"recipe {recipe} has no published artifact AI Hub can compile (targets: {', '.join(SOURCES)})")
    for a in chosen:
        graphs = [fn for fn in a.files if fn.endswith(".onnx")]
        if len(graphs) != 1:
            raise UnsupportedError(f"artifact {a.id} has {len(graphs)} graphs; AI Hub jobs here take one-graph "
                                   "artifacts (a multi-part component needs one compile per part: not yet)")
    return chosen


def pinned_recipe(store: Store, arts: list[StoredArtifact], requested):
    """The recipe every chosen artifact's manifest pins; it must be the one this command was asked for (with the
    same overrides), so the components rebuilt here and the thresholds applied are the ones that built them."""
    pins = {a.manifest["recipe"]["hash"] for a in arts}
    if len(pins) != 1:
        raise BadInput(f"the chosen artifacts of {requested.name} pin {len(pins)} different recipes; rerun the recipe")
    pin = pins.pop()
    r, where = Runs(store.root).pinned(requested.name, pin)
    if r is None:
        raise BadInput(f"artifact {arts[0].id}: recipe.hash: {where}")
    if r.hash != requested.hash:
        raise BadInput(f"artifact {arts[0].id} was built by recipe {r.name} with hash {pin[:12]}… and this command "
                       f"asks for hash {requested.hash[:12]}…; pass the same --preset/--checkpoint/--seed/--context "
                       "as the recipe run")
    return r


def load_components(recipe, store: Store):
    """The recipe's model and components, built by the pipeline's own loader (validated options included)."""
    from ..pipeline import Pipeline

    p = Pipeline(recipe, store)
    comps = p.load_components()
    return p.bundle, comps


def check_same_build(a: StoredArtifact, bundle, comp) -> None:
    m = a.manifest
    if m["model"]["weights_hash"] != bundle.weights_hash or m["model"]["config_hash"] != bundle.config_hash:
        raise BadInput(f"artifact {a.id} was built from other weights or config than this recipe builds; "
                       "pass the same --preset/--checkpoint/--seed as the recipe run")
    if json.loads(json.dumps(comp.describe())) != m["artifact"]["component"]:
        raise BadInput(f"artifact {a.id} has another IO than component {comp.name} builds (pass the same --context)")


def plan(arts: list[StoredArtifact], device: HubDevice, opts: Options, steps: int, ledger) -> list[PlannedJob]:
    jobs = []
    for a in arts:
        files = " + ".join(sorted(a.files))
        u = ledger.find(a.sha256, "*", "upload", upload_spec(a))
        jobs.append(PlannedJob("upload", a.id, "-", "", f"{files} (sha256 {a.sha256[:12]})", u and u["model_id"]))
        for kind, spec, what in job_specs(a, device, opts, steps):
            e = ledger.entries.get(ledger.key(a.sha256, device.key, kind))  # the inputs hash is not computed here
            e = e if e and {k: v for k, v in e["spec"].items() if k != "inputs"} == spec else None
            jobs.append(PlannedJob(kind, a.id, device.hub_name, spec["options"], what, e and e["job_id"]))
    return jobs


def upload_spec(a: StoredArtifact) -> dict:
    return {"files": {fn: f["sha256"] for fn, f in a.files.items()}}


def job_specs(a: StoredArtifact, device: HubDevice, opts: Options, steps: int, inputs_hash: str | None = None):
    n_in = len(a.manifest["artifact"]["component"]["inputs"])
    return [
        ("compile", {"device": device.hub_name, "options": opts.compile_options()}, f"compile {a.id} for the NPU"),
        ("profile", {"device": device.hub_name, "options": opts.run_options(), "profile": True},
         "profile the compiled model (service-generated inputs)"),
        ("inference", {"device": device.hub_name, "options": opts.run_options(), "profile": False, "steps": steps,
                       **({"inputs": inputs_hash} if inputs_hash else {})},
         f"inference on up to {steps} recorded steps of the fp32 run ({n_in} inputs each)"),
    ]


def stage_upload(a: StoredArtifact, tmp: Path) -> Path:
    """The artifact's files, each checked against its manifest hash, in a directory of their own for the upload."""
    d = tmp / a.id
    d.mkdir()
    for fn, f in a.files.items():
        src = a.dir / fn
        if hash_file(src) != f["sha256"]:
            raise BadInput(f"{src} does not match the sha256 in its manifest; the stored artifact was modified")
        try:
            os.link(src, d / fn)
        except OSError:
            shutil.copy2(src, d / fn)
    return d


# -- the parity inputs ----------------------------------------------------------------------------------------------
@dataclass
class ParityInputs:
    mode: str                                   # one of parity.gate.DEVICE_MODE_NAMES
    names: list[str]
    feeds: dict[str, list[np.ndarray]]          # input name -> one array per step
    reference: list[Sequence]                   # fp32: outputs for exactly these inputs (+ the greedy tokens)
    steps: list[int]                            # steps per sequence
    hash: str = ""


def parity_inputs(comp, recipe, steps: int) -> ParityInputs:
    prompts = load_prompt_set(recipe.prompts.parity)
    opts = {"max_prompt_tokens": recipe.prompts.max_prompt_tokens, "new_tokens": recipe.parity.new_tokens}
    names = [s.name for s in comp.input_specs()]
    feeds: dict[str, list[np.ndarray]] = {n: [] for n in names}
    reference = comp.reference(prompts, opts)
    if teacher_forced(comp):
        refs, counts = _teacher_forced(comp, reference, steps, names, feeds)
        mode = "teacher-forced"
    else:
        refs, counts = _per_call(comp, reference, steps, names, feeds)
        mode = "per-call"
    pi = ParityInputs(mode, names, feeds, refs, counts)
    pi.hash = hash_tensors({f"{n}/{i:05d}": a for n, lst in feeds.items() for i, a in enumerate(lst)})
    return pi


def teacher_forced(comp) -> bool:
    """An LM step whose class declares its ``trace`` the token loop ``run_tokens`` drives
    (``Component.trace_is_token_loop``); any other component (a prefill tracing chunks of its own) is sent call by
    call."""
    return comp.kind == "lm" and comp.trace_is_token_loop


def _keep(feeds: dict, names: list[str], f: dict) -> None:
    for n in names:
        feeds[n].append(np.array(f[n], dtype=np.float32, copy=True))


def _teacher_forced(comp, reference, steps, names, feeds):
    refs, counts, budget, eager = [], [], steps, comp.eager_runner()
    for ref in reference:
        if budget <= 0:
            break
        start = ref.n_prompt - 1
        k = min(budget, len(ref.tokens) - start)
        seen = [0]

        def record(f, lo=start, hi=start + k):
            if lo <= seen[0] < hi:
                _keep(feeds, names, f)
            seen[0] += 1

        outs, _ = comp.run_tokens(eager, ref.tokens, record=record, max_steps=start + k)
        window = {n: v[start:start + k] for n, v in outs.items()}
        refs.append(Sequence(ref.tokens[start:start + k], ref.n_prompt - start, window, ref.generated))
        counts.append(k)
        budget -= k
    return refs, counts


def _per_call(comp, reference, steps, names, feeds):
    """Every graph call the component's host loop makes with the eager fp32 graph, and that graph's outputs: one
    sequence of calls in the order the loop made them. ``trace`` returns its sequences only once it has made every
    call (and some loops make a second pass over the same sequences), so calls are not split by sequence."""
    eager, out_names = comp.eager_runner(), [s.name for s in comp.output_specs()]
    calls: list[list[np.ndarray]] = []

    def run(f):
        _keep(feeds, names, f)
        outs = eager(f)
        calls.append([np.asarray(o, np.float32) for o in outs])
        return outs

    comp.trace(run, reference, steps)
    if not calls:
        raise UnsupportedError(f"component {comp.name} made no graph call within {steps} steps: nothing to send")
    ref = Sequence([], 0, {k: np.stack([c[i] for c in calls]) for i, k in enumerate(out_names)})
    return [ref], [len(calls)]


def device_trace(pi: ParityInputs, got: dict, output_names: list[str], output_shapes: list[tuple]):
    """Split the device's output dataset into per-sequence traces aligned with the reference."""
    if set(got) == set(output_names):
        how = "by name"
    elif len(got) == len(output_names):
        how = "by position (the service renamed the outputs)"
        got = dict(zip(output_names, (got[k] for k in list(got))))
    else:
        raise HubError(f"the inference job returned outputs {sorted(got)[:4]}..., expected {len(output_names)}: "
                       f"{', '.join(output_names[:4])}, ...")
    total = sum(pi.steps)
    stacked = {}
    for name, shape in zip(output_names, output_shapes):
        arrs = got[name]
        if len(arrs) != total:
            raise HubError(f"the inference job returned {len(arrs)} samples of {name}, sent {total}")
        if arrs and not np.issubdtype(np.asarray(arrs[0]).dtype, np.floating):
            raise HubError(f"output {name} came back as {np.asarray(arrs[0]).dtype} (quantized IO); compile without "
                           "--quantize_io so outputs compare with fp32")
        per = [np.asarray(a, np.float32).reshape(shape) for a in arrs]
        stacked[name] = np.concatenate(per, axis=0) if pi.mode == "teacher-forced" else np.stack(per)
    trace, start = [], 0
    for ref, n in zip(pi.reference, pi.steps):
        trace.append(Sequence(ref.tokens[:n], ref.n_prompt, {k: v[start:start + n] for k, v in stacked.items()}))
        start += n
    return trace, how
