"""AI Hub jobs for one stored artifact on one device: upload -> compile -> profile + inference -> the same gate.

On-device parity is **teacher-forced per step with the caches fed from the fp32 run**: the exact graph inputs of a
bounded number of teacher-forced steps of the eager fp32 host loop are recorded and sent as one inference dataset;
the device's outputs for each step are compared with the fp32 outputs for those same inputs (``parity.metrics``)
and judged with the recipe's thresholds (``parity.gate``). Unlike the local trace, the device never feeds its own
K/V rows back, so errors do not compound along a sequence; free-running greedy agreement (one job per token) is not
measured on the device and stays gated by the local runtime.

The verdict goes into the artifact's manifest (section ``hub``, one entry per device) and the artifact is placed
again with ``Store.place``: a failing on-device parity moves it to ``blocked`` exactly like a local failure.
Credentials come only from the ``qai-hub`` client's own configuration; the token is never printed or written.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from ..artifacts.hashing import hash_file, hash_tensors, hash_value
from ..artifacts.store import SHELVES, Store, write_json_atomic
from ..calibration.prompts import PromptSet, load_prompt_set
from ..components.base import Sequence
from ..devices import get_device
from ..errors import BadInput, HubError, MissingDependency, OmniError, RecipeError, UnsupportedError
from ..parity import gate
from ..parity.metrics import compare
from .ledger import Ledger

# Stored targets AI Hub can take as the source of an NPU compile, and why. A new source is one line here.
SOURCES = {
    "qdq_onnx": "the QDQ ONNX graph; AI Hub keeps its calibrated quantization when it compiles for the HTP",
}
TARGET_RUNTIMES = ("qnn_context_binary", "qnn_dlc")
# Gate metrics this measurement cannot produce, and why (their thresholds stay enforced by the local verdict).
NOT_MEASURED = {
    "greedy_agreement": "free-running greedy generation needs one inference job per token; on the device only "
                        "teacher-forced steps are measured, so this metric stays gated by the local runtime",
}
PARITY_MODE = ("teacher-forced per step: graph inputs of N teacher-forced steps of the eager fp32 run (caches fed "
               "from the fp32 run; per sequence the steps whose logits predict the greedy tokens), sent as one "
               "inference dataset; device outputs vs the fp32 outputs for the same inputs")
SHELF = {gate.PASS: "published", gate.BLOCKED: "blocked", gate.UNVERIFIED: "unverified"}


# -- what is submitted --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HubDevice:
    key: str            # how the manifest and ledger name it: omni-export's device name, or the service's name
    hub_name: str       # the name AI Hub lists
    chipset: str | None


def resolve_device(name: str) -> HubDevice:
    """omni-export's devices by name or chipset (galaxy_s25, SM8650, ...); any other name is passed to the service
    as-is (whatever ``qai_hub.get_devices()`` lists), and the client refuses a name the service does not know."""
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


@dataclass(frozen=True)
class Options:
    target_runtime: str = "qnn_context_binary"
    qairt_version: str | None = None
    steps: int | None = None          # teacher-forced steps sent to the device (default: recipe parity budget)
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


def plan(arts: list[StoredArtifact], device: HubDevice, opts: Options, steps: int, ledger: Ledger) -> list[PlannedJob]:
    jobs = []
    for a in arts:
        files = " + ".join(sorted(a.files))
        u = ledger.find(a.sha256, "*", "upload", _upload_spec(a))
        jobs.append(PlannedJob("upload", a.id, "-", "", f"{files} (sha256 {a.sha256[:12]})", u and u["model_id"]))
        for kind, spec, what in _job_specs(a, device, opts, steps):
            e = ledger.entries.get(ledger.key(a.sha256, device.key, kind))  # the inputs hash is not computed here
            e = e if e and {k: v for k, v in e["spec"].items() if k != "inputs"} == spec else None
            jobs.append(PlannedJob(kind, a.id, device.hub_name, spec["options"], what, e and e["job_id"]))
    return jobs


def _upload_spec(a: StoredArtifact) -> dict:
    return {"files": {fn: f["sha256"] for fn, f in a.files.items()}}


def _job_specs(a: StoredArtifact, device: HubDevice, opts: Options, steps: int, inputs_hash: str | None = None):
    n_in = len(a.manifest["artifact"]["component"]["inputs"])
    return [
        ("compile", {"device": device.hub_name, "options": opts.compile_options()},
         f"compile {a.id} for the NPU"),
        ("profile", {"device": device.hub_name, "options": opts.run_options(), "profile": True},
         "profile the compiled model (service-generated inputs)"),
        ("inference", {"device": device.hub_name, "options": opts.run_options(), "profile": False, "steps": steps,
                       **({"inputs": inputs_hash} if inputs_hash else {})},
         f"inference on up to {steps} teacher-forced steps of the fp32 run ({n_in} inputs each)"),
    ]


# -- the parity inputs ----------------------------------------------------------------------------------------------
@dataclass
class ParityInputs:
    names: list[str]
    feeds: dict[str, list[np.ndarray]]          # input name -> one array per step
    reference: list[Sequence]                   # fp32: outputs for exactly these inputs, + the greedy tokens
    steps: list[int]                            # steps per sequence
    hash: str = ""


def build_component(recipe):
    from ..models import build_model
    bundle = build_model(recipe.model.family, recipe.model.preset, recipe.model.seed,
                         Path(recipe.model.checkpoint) if recipe.model.checkpoint else None)
    comps = {}
    for name in recipe.components:
        factory = bundle.family.components.get(name)
        if factory is None:
            raise RecipeError(f"model {recipe.model.family} has no component {name!r}")
        comps[name] = factory(bundle, context=recipe.context)
    return bundle, comps


def check_same_build(a: StoredArtifact, bundle, comp) -> None:
    m = a.manifest
    if m["model"]["weights_hash"] != bundle.weights_hash or m["model"]["config_hash"] != bundle.config_hash:
        raise BadInput(f"artifact {a.id} was built from other weights or config than this recipe builds; "
                       "pass the same --preset/--checkpoint/--seed as the recipe run")
    if json.loads(json.dumps(comp.describe())) != m["artifact"]["component"]:
        raise BadInput(f"artifact {a.id} has another IO than component {comp.name} builds (pass the same --context)")


def parity_inputs(comp, recipe, steps: int) -> ParityInputs:
    """Record the graph inputs of up to ``steps`` teacher-forced steps of the eager fp32 host loop over the parity
    prompts, and the fp32 outputs for those inputs.

    The caches in every recorded input come from the fp32 run, so any window of steps can be sent on its own: per
    sequence the window is the steps whose logits predict the reference's greedy tokens (the positions the LM
    metrics read), sequence after sequence until the budget is spent."""
    if comp.kind != "lm" or not hasattr(comp, "run_tokens"):
        raise UnsupportedError(f"on-device parity drives teacher-forced LM components only; {comp.name} is {comp.kind}")
    prompts = load_prompt_set(recipe.prompts.parity)
    opts = {"max_prompt_tokens": recipe.prompts.max_prompt_tokens, "new_tokens": recipe.parity.new_tokens}
    names = [s.name for s in comp.input_specs()]
    feeds: dict[str, list[np.ndarray]] = {n: [] for n in names}
    refs, counts, budget, eager = [], [], steps, comp.eager_runner()
    for p in prompts.prompts:
        if budget <= 0:
            break
        ref, = comp.reference(PromptSet(prompts.name, (p,)), opts)
        start = ref.n_prompt - 1
        k = min(budget, len(ref.tokens) - start)
        seen = [0]

        def record(f, lo=start, hi=start + k):
            if lo <= seen[0] < hi:
                for n in names:
                    feeds[n].append(np.array(f[n], dtype=np.float32, copy=True))
            seen[0] += 1

        outs, _ = comp.run_tokens(eager, ref.tokens, record=record, max_steps=start + k)
        window = {n: v[start:start + k] for n, v in outs.items()}
        refs.append(Sequence(ref.tokens[start:start + k], ref.n_prompt - start, window, ref.generated))
        counts.append(k)
        budget -= k
    pi = ParityInputs(names, feeds, refs, counts)
    pi.hash = hash_tensors({f"{n}/{i:05d}": a for n, lst in feeds.items() for i, a in enumerate(lst)})
    return pi


def device_trace(pi: ParityInputs, got: dict, output_names: list[str], output_shapes: list[tuple]) -> tuple[list[Sequence], str]:
    """Split the device's output dataset into per-sequence traces aligned with the reference."""
    if set(got) == set(output_names):
        order, how = output_names, "by name"
    elif len(got) == len(output_names):
        order, how = list(got), "by position (the service renamed the outputs)"
        got = dict(zip(output_names, (got[k] for k in order)))
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
        stacked[name] = np.concatenate([np.asarray(a, np.float32).reshape(shape) for a in arrs], axis=0)
    trace, start = [], 0
    for ref, n in zip(pi.reference, pi.steps):
        trace.append(Sequence(ref.tokens[:n], ref.n_prompt, {k: v[start:start + n] for k, v in stacked.items()}))
        start += n
    return trace, how


# -- the client ---------------------------------------------------------------------------------------------------
class HubSession:
    """The qai-hub client, configured only from its own config (client.ini / QAIHUB_CLIENT_INI); the token stays
    inside the client and is redacted from any message that leaves this class."""

    def __init__(self):
        try:
            import qai_hub
            from qai_hub import api_utils
        except ImportError:
            raise MissingDependency("qai-hub is not installed (pip install qai-hub)") from None
        self.hub = qai_hub
        self.client = qai_hub.Client()
        where = api_utils.get_config_path()
        try:
            cfg = self.client.config
        except BaseException as e:  # the client raises its own errors (or exits) on a missing or broken config
            if isinstance(e, KeyboardInterrupt):
                raise
            raise HubError(f"no AI Hub API token: the qai-hub client has no usable configuration at {where} "
                           "(run `qai-hub configure --api_token ...`, or set QAIHUB_CLIENT_INI to a client.ini)") from None
        self._token = (cfg.api_token or "").strip()
        if not self._token:
            raise HubError(f"no AI Hub API token: {where} has an empty api_token "
                           "(run `qai-hub configure --api_token ...`)")
        cfg.verbose = False  # progress is shown by omni-export; the client would print its own bars to stdout

    def redact(self, text: str) -> str:
        return text.replace(self._token, "***") if self._token else text

    @contextlib.contextmanager
    def calling(self, what: str):
        try:
            with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):  # the client prints to stdout
                yield
        except (OmniError, KeyboardInterrupt):
            raise
        except BaseException as e:
            msg = str(e).strip().splitlines()
            raise HubError(self.redact(f"{what}: {type(e).__name__}: {msg[0] if msg else ''}")[:400]) from None

    def wait(self, jobs: dict[str, object], console: Console, poll: float, timeout: float) -> dict:
        """Poll until every job finished, with a live status line per job."""
        done, t0 = {}, time.monotonic()
        cols = (SpinnerColumn(), TextColumn("  {task.description}"), TextColumn("[cyan]{task.fields[state]}"),
                TimeElapsedColumn())
        with Progress(*cols, console=console, transient=True) as prog:
            tasks = {k: prog.add_task(k, total=None, state="submitted") for k in jobs}
            while len(done) < len(jobs):
                for k, job in jobs.items():
                    if k in done:
                        continue
                    with self.calling(f"status of AI Hub job {job.job_id}"):
                        st = job.get_status()
                    prog.update(tasks[k], state=st.code)
                    if st.finished:
                        done[k] = st
                if len(done) < len(jobs):
                    if time.monotonic() - t0 > timeout:
                        waiting = ", ".join(f"{k} {jobs[k].job_id}" for k in jobs if k not in done)
                        raise HubError(f"AI Hub jobs still running after {timeout:.0f} s ({waiting}); "
                                       "rerun the same command to resume waiting")
                    time.sleep(poll)
        return done


# -- one artifact on one device ---------------------------------------------------------------------------------------
@dataclass
class HubResult:
    artifact: str
    device: str
    status: str
    reasons: list[str]
    section: dict
    location: Path
    reused: list[str] = field(default_factory=list)


def _job_ref(job, status=None) -> dict:
    d = {"job_id": job.job_id, "url": job.url, "options": job.options, "hub_version": job.hub_version or None}
    if status is not None:
        d["status"] = status.code
        if status.failure:
            d["failure"] = status.message
    return d


def _stage_upload(a: StoredArtifact, tmp: Path) -> Path:
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


def _profile_summary(profile: dict) -> dict:
    s = profile.get("execution_summary", {})
    units: dict[str, int] = {}
    for layer in profile.get("execution_detail", []):
        units[layer.get("compute_unit", "?")] = units.get(layer.get("compute_unit", "?"), 0) + 1
    times = s.get("all_inference_times") or []
    out = {
        "latency_ms": s["estimated_inference_time"] / 1000.0 if s.get("estimated_inference_time") else None,
        "latency_ms_min": min(times) / 1000.0 if times else None,
        "latency_ms_median": float(np.median(times)) / 1000.0 if times else None,
        "inference_runs": len(times) or None,
        "peak_memory_bytes": s.get("estimated_inference_peak_memory"),
        "inference_memory_peak_range_bytes": s.get("inference_memory_peak_range"),
        "first_load_ms": s["first_load_time"] / 1000.0 if s.get("first_load_time") else None,
        "layers_by_compute_unit": units,
    }
    return out


def run_on_device(session: HubSession, store: Store, ledger: Ledger, recipe, a: StoredArtifact, device: HubDevice,
                  comp, pi: ParityInputs, opts: Options, console: Console) -> HubResult:
    hub, client, reused = session.hub, session.client, []
    sha = a.sha256
    specs = {k: s for k, s, _ in _job_specs(a, device, opts, sum(pi.steps), pi.hash)}

    # upload (once per artifact, whatever the device)
    up = ledger.find(sha, "*", "upload", _upload_spec(a))
    if up:
        with session.calling(f"AI Hub model {up['model_id']}"):
            model = client.get_model(up["model_id"])
        reused.append(f"model {model.model_id}")
    else:
        with tempfile.TemporaryDirectory() as tmp, session.calling(f"uploading {a.id} to AI Hub"):
            model = client.upload_model(str(_stage_upload(a, Path(tmp))), name=a.id)
        ledger.record(sha, "*", "upload", _upload_spec(a), model_id=model.model_id)

    def job(kind: str, submit):
        e = ledger.find(sha, device.key, kind, specs[kind])
        if e:
            with session.calling(f"AI Hub {kind} job {e['job_id']}"):
                j = client.get_job(e["job_id"])
            reused.append(f"{kind} {j.job_id}")
            return j
        with session.calling(f"submitting the {kind} job for {a.id} on {device.hub_name}"):
            j = submit()
        ledger.record(sha, device.key, kind, specs[kind], job_id=j.job_id, url=j.url)
        console.log(f"{kind} job {j.job_id} submitted: {j.url}")
        return j

    target_dev = hub.Device(device.hub_name)
    cj = job("compile", lambda: client.submit_compile_job(model, device=target_dev, name=f"{a.id} compile",
                                                           options=opts.compile_options()))
    st = session.wait({f"compile {a.id}": cj}, console, opts.poll_seconds, opts.timeout_seconds)
    cst = next(iter(st.values()))
    if not cst.success:
        raise HubError(f"AI Hub compile job {cj.job_id} for {a.id} on {device.hub_name} failed: {cst.message} ({cj.url})")
    with session.calling(f"target model of compile job {cj.job_id}"):
        target = cj.get_target_model()
    dataset = {n: pi.feeds[n] for n in pi.names}
    pj = job("profile", lambda: client.submit_inference_job(target, device=target_dev, inputs=None, profile=True,
                                                            name=f"{a.id} profile", options=opts.run_options()))
    ij = job("inference", lambda: client.submit_inference_job(target, device=target_dev, inputs=dataset, profile=False,
                                                              name=f"{a.id} parity", options=opts.run_options()))
    st = session.wait({f"profile {a.id}": pj, f"inference {a.id}": ij}, console, opts.poll_seconds, opts.timeout_seconds)
    pst, ist = st[f"profile {a.id}"], st[f"inference {a.id}"]
    for kind, j, s in (("profile", pj, pst), ("inference", ij, ist)):
        if not s.success:
            raise HubError(f"AI Hub {kind} job {j.job_id} for {a.id} on {device.hub_name} failed: {s.message} ({j.url})")
    with session.calling(f"profile of job {pj.job_id}"):
        profile = pj.download_profile()
        # a job object made at submission lacks what the service reports later (its version): look both up again
        pj_info, ij_info = client.get_job(pj.job_id), client.get_job(ij.job_id)
    outputs = _load_outputs(session, store, ij)

    out_specs = comp.output_specs()
    trace, how = device_trace(pi, outputs, [s.name for s in out_specs], [s.shape for s in out_specs])
    parity = compare(pi.reference, trace, comp.kind == "lm")
    thresholds = list(recipe.thresholds_for(comp.name, a.manifest["scheme"]["name"]))
    measured = [t for t in thresholds if t.metric not in NOT_MEASURED]
    verdict = gate.judge(parity, measured, [s.name for s in out_specs])
    dev = getattr(cj, "device", None)
    section = {
        "service_job_urls": {"compile": cj.url, "profile": pj.url, "inference": ij.url},
        "device": {"requested": device.key, "hub_name": device.hub_name, "chipset": device.chipset,
                   "os": getattr(dev, "os", None) or None, "attributes": list(getattr(dev, "attributes", []) or [])},
        "source": {"model_id": model.model_id, "artifact_sha256": sha, "why": SOURCES[a.target]},
        "compile": {**_job_ref(cj, cst), "target_runtime": opts.target_runtime,
                    "qairt_version": opts.qairt_version or "service default",
                    "target_model_id": getattr(target, "model_id", None)},
        "profile": {**_job_ref(pj_info, pst), **_profile_summary(profile)},
        "inference": {**_job_ref(ij_info, ist), "samples": sum(pi.steps), "inputs_sha256": pi.hash,
                      "outputs_matched": how},
        "parity": {"mode": PARITY_MODE, "steps": sum(pi.steps), "sequences": len(pi.steps),
                   "prompt_set": recipe.prompts.parity, "metrics": parity,
                   "not_measured": {t.metric: NOT_MEASURED[t.metric] for t in thresholds if t.metric in NOT_MEASURED}},
        "thresholds": [t.to_dict() for t in measured],
        "verdict": verdict,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    location, status, reasons = place_with_hub(store, recipe.name, a, device.key, section)
    return HubResult(a.id, device.key, status, reasons, section, location, reused)


def _load_outputs(session: HubSession, store: Store, ij) -> dict:
    """The inference job's output dataset, kept in the store so a rerun does not download it again."""
    path = store.root / "hub" / "outputs" / f"{ij.job_id}.npz"
    if path.exists():
        z = np.load(path)
        names = json.loads(str(z["__order__"]))
        return {n: [z[f"{i}/{k}"] for k in range(int(z[f"{i}/n"]))] for i, n in enumerate(names)}
    with session.calling(f"output data of inference job {ij.job_id}"):
        got = ij.download_output_data()
    if not got:
        raise HubError(f"AI Hub inference job {ij.job_id} produced no output dataset ({ij.url})")
    arrays = {"__order__": np.asarray(json.dumps(list(got)))}
    for i, (n, lst) in enumerate(got.items()):
        arrays[f"{i}/n"] = np.asarray(len(lst))
        arrays.update({f"{i}/{k}": np.asarray(a) for k, a in enumerate(lst)})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}")
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, path)
    return got


def combined_verdict(local: dict, hub: dict) -> dict:
    """The artifact's verdict: the local one, plus every device's on-device verdict. Any block blocks."""
    statuses = [local["status"]] + [h["verdict"]["status"] for h in hub.values()]
    reasons, checks = list(local["reasons"]), list(local["checks"])
    for dev, h in hub.items():
        reasons += [f"on-device ({dev}, AI Hub): {r}" for r in h["verdict"]["reasons"]]
        checks += [{**c, "where": f"ai-hub {dev}"} for c in h["verdict"]["checks"]]
    status = gate.BLOCKED if gate.BLOCKED in statuses else gate.UNVERIFIED if gate.UNVERIFIED in statuses else gate.PASS
    return {"status": status, "reasons": reasons, "checks": checks}


def place_with_hub(store: Store, recipe: str, a: StoredArtifact, device_key: str, section: dict):
    m = dict(a.manifest)
    m.setdefault("local_verdict", m["verdict"])
    m["hub"] = {**(m.get("hub") or {}), device_key: section}
    m["verdict"] = combined_verdict(m["local_verdict"], m["hub"])
    files = {fn: a.dir / fn for fn in a.files}
    location = store.place(SHELF[m["verdict"]["status"]], recipe, a.id, files, m)
    return location, m["verdict"]["status"], m["verdict"]["reasons"]


def write_report(store: Store, recipe: str, results: list[HubResult]) -> Path:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = store.root / "runs" / recipe / "hub" / stamp / "report.json"
    write_json_atomic(out, {"recipe": recipe, "created": stamp, "artifacts": [
        {"id": r.artifact, "device": r.device, "status": r.status, "reasons": r.reasons, "reused": r.reused,
         "location": str(r.location.relative_to(store.root)), "hub": r.section} for r in results]})
    return out
