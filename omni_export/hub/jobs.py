"""AI Hub jobs for one stored artifact on one device: upload -> compile -> profile + inference -> the same gate.

The order of concerns: ``client`` (every call to the service), ``ledger`` (submitted jobs, so a rerun resumes),
``payload`` (what is sent: artifacts, recipe and components, the recorded inputs), ``judging`` (the device's figures
against the pinned recipe, and the shelf). This module runs them in sequence for one artifact.

Unlike the local trace, the device never feeds its own outputs back (every recorded input comes from the fp32
run), so errors do not compound along a sequence; free-running greedy agreement is not measured on the device and
stays gated by the local runtime. Credentials come only from the ``qai-hub`` client's own configuration; the token
is never printed or written.
"""
from __future__ import annotations

import datetime as _dt
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rich.console import Console

from ..artifacts.atomic import write_bytes_atomic, write_json_atomic
from ..artifacts.store import Store
from ..errors import HubError
from . import judging
from .client import HubSession
from .ledger import Ledger
from .payload import SOURCES, HubDevice, Options, StoredArtifact, device_trace, job_specs, parity_inputs, stage_upload, \
    upload_spec


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


def _profile_summary(profile: dict) -> dict:
    s = profile.get("execution_summary", {})
    units: dict[str, int] = {}
    for layer in profile.get("execution_detail", []):
        units[layer.get("compute_unit", "?")] = units.get(layer.get("compute_unit", "?"), 0) + 1
    times = s.get("all_inference_times") or []
    ms = lambda v: v / 1000.0 if v else None  # noqa: E731 (the service reports microseconds)
    return {"latency_ms": ms(s.get("estimated_inference_time")), "latency_ms_min": ms(min(times)) if times else None,
            "latency_ms_median": ms(float(np.median(times))) if times else None, "inference_runs": len(times) or None,
            "peak_memory_bytes": s.get("estimated_inference_peak_memory"),
            "inference_memory_peak_range_bytes": s.get("inference_memory_peak_range"),
            "first_load_ms": ms(s.get("first_load_time")), "layers_by_compute_unit": units}


class DeviceRun:
    """The jobs of one artifact on one device, each found in the ledger or submitted (and recorded) once."""

    def __init__(self, session: HubSession, ledger: Ledger, a: StoredArtifact, device: HubDevice, console: Console):
        self.s, self.ledger, self.a, self.device, self.console = session, ledger, a, device, console
        self.reused: list[str] = []
        self.target_dev = session.hub.Device(device.hub_name)

    def upload(self):
        a, client = self.a, self.s.client
        up = self.ledger.find(a.sha256, "*", "upload", upload_spec(a))
        if up:
            model = self.s.call(f"AI Hub model {up['model_id']}", lambda: client.get_model(up["model_id"]))
            self.reused.append(f"model {model.model_id}")
            return model
        with tempfile.TemporaryDirectory() as tmp, self.s.calling(f"uploading {a.id} to AI Hub"):
            # the client's own zip of a directory stays in the temp dir after the upload (qai-hub 0.x): zip it here,
            # with the client's own zipper (same archive), inside a directory that is removed
            from qai_hub.util.zipped_model import zip_model

            model = client.upload_model(zip_model(str(Path(tmp) / "zip"), str(stage_upload(a, Path(tmp)))), name=a.id)
        self.ledger.record(a.sha256, "*", "upload", upload_spec(a), model_id=model.model_id)
        return model

    def job(self, kind: str, spec: dict, submit):
        e = self.ledger.find(self.a.sha256, self.device.key, kind, spec)
        if e:
            j = self.s.call(f"AI Hub {kind} job {e['job_id']}", lambda: self.s.client.get_job(e["job_id"]))
            self.reused.append(f"{kind} {j.job_id}")
            return j
        with self.s.calling(f"submitting the {kind} job for {self.a.id} on {self.device.hub_name}"):
            j = submit()
        self.ledger.record(self.a.sha256, self.device.key, kind, spec, job_id=j.job_id, url=j.url)
        self.console.log(f"{kind} job {j.job_id} submitted: {j.url}")
        return j


def run_on_device(session: HubSession, store: Store, ledger: Ledger, recipe, a: StoredArtifact, device: HubDevice,
                  comp, opts: Options, steps: int, console: Console) -> HubResult:
    """``recipe`` is the one the artifact's manifest pins (``payload.pinned_recipe``)."""
    run, client = DeviceRun(session, ledger, a, device, console), session.client
    model = run.upload()
    compile_spec = job_specs(a, device, opts, steps)[0][1]
    cj = run.job("compile", compile_spec, lambda: client.submit_compile_job(
        model, device=run.target_dev, name=f"{a.id} compile", options=opts.compile_options()))
    cst = next(iter(session.wait({f"compile {a.id}": cj}, console, opts.poll_seconds, opts.timeout_seconds).values()))
    common = {"device": {"requested": device.key, "hub_name": device.hub_name, "chipset": device.chipset},
              "source": {"model_id": model.model_id, "artifact_sha256": a.sha256, "why": SOURCES[a.target]}}
    if not cst.success:  # the service's reason blocks the artifact; nothing else is submitted
        section = {**common, "service_job_urls": {"compile": cj.url}, **judging.failed_compile(
            {**_job_ref(cj, cst), "target_runtime": opts.target_runtime}, cst.message or cst.code)}
        location, status, reasons = judging.place_with_hub(store, recipe.name, a, device.key, section)
        return HubResult(a.id, device.key, status, reasons, section, location, run.reused)

    with console.status(f"recording {steps} fp32 steps for {a.id}…"):
        pi = parity_inputs(comp, recipe, steps)
    specs = {k: s for k, s, _ in job_specs(a, device, opts, sum(pi.steps), pi.hash)}
    target = session.call(f"target model of compile job {cj.job_id}", cj.get_target_model)
    dataset = {n: pi.feeds[n] for n in pi.names}
    pj = run.job("profile", specs["profile"], lambda: client.submit_inference_job(
        target, device=run.target_dev, inputs=None, profile=True, name=f"{a.id} profile", options=opts.run_options()))
    ij = run.job("inference", specs["inference"], lambda: client.submit_inference_job(
        target, device=run.target_dev, inputs=dataset, profile=False, name=f"{a.id} parity", options=opts.run_options()))
    st = session.wait({f"profile {a.id}": pj, f"inference {a.id}": ij}, console, opts.poll_seconds, opts.timeout_seconds)
    pst, ist = st[f"profile {a.id}"], st[f"inference {a.id}"]
    for kind, j, s in (("profile", pj, pst), ("inference", ij, ist)):
        if not s.success:
            raise HubError(f"AI Hub {kind} job {j.job_id} for {a.id} on {device.hub_name} failed: {s.message} ({j.url})")
    profile = session.call(f"profile of job {pj.job_id}", pj.download_profile, 600)
    # a job object made at submission lacks what the service reports later (its version): look both up again
    pj_info = session.call(f"AI Hub job {pj.job_id}", lambda: client.get_job(pj.job_id))
    ij_info = session.call(f"AI Hub job {ij.job_id}", lambda: client.get_job(ij.job_id))
    outputs = _load_outputs(session, store, ij)

    out_specs = comp.output_specs()
    trace, how = device_trace(pi, outputs, [s.name for s in out_specs], [s.shape for s in out_specs])
    judged = judging.device_verdict(pi, trace, comp, recipe, a.manifest["scheme"]["name"])
    dev = getattr(cj, "device", None)
    common["device"].update(os=getattr(dev, "os", None) or None, attributes=list(getattr(dev, "attributes", []) or []))
    section = {
        **common, "service_job_urls": {"compile": cj.url, "profile": pj.url, "inference": ij.url},
        "compile": {**_job_ref(cj, cst), "target_runtime": opts.target_runtime,
                    "qairt_version": opts.qairt_version or "service default",
                    "target_model_id": getattr(target, "model_id", None)},
        "profile": {**_job_ref(pj_info, pst), **_profile_summary(profile)},
        "inference": {**_job_ref(ij_info, ist), "samples": sum(pi.steps), "inputs_sha256": pi.hash,
                      "outputs_matched": how},
        **judged,
    }
    location, status, reasons = judging.place_with_hub(store, recipe.name, a, device.key, section)
    return HubResult(a.id, device.key, status, reasons, section, location, run.reused)


def _load_outputs(session: HubSession, store: Store, ij) -> dict:
    """The inference job's output dataset, kept in the store so a rerun does not download it again."""
    path = store.root / "hub" / "outputs" / f"{ij.job_id}.npz"
    if path.exists():
        z = np.load(path)
        names = json.loads(str(z["__order__"]))
        return {n: [z[f"{i}/{k}"] for k in range(int(z[f"{i}/n"]))] for i, n in enumerate(names)}
    with tempfile.TemporaryDirectory() as tmp:  # downloaded to memory, the client leaves an empty temp file behind
        got_file = session.call(f"output data of inference job {ij.job_id}",
                                lambda: ij.download_output_data(str(Path(tmp) / "outputs.h5")), 600)
        got = _read_h5(got_file) if got_file else None
    if not got:
        raise HubError(f"AI Hub inference job {ij.job_id} produced no output dataset ({ij.url})")
    arrays = {"__order__": np.asarray(json.dumps(list(got)))}
    for i, (n, lst) in enumerate(got.items()):
        arrays[f"{i}/n"] = np.asarray(len(lst))
        arrays.update({f"{i}/{k}": np.asarray(a) for k, a in enumerate(lst)})
    import io

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    write_bytes_atomic(path, buf.getvalue())
    return got


def _read_h5(path: str) -> dict:
    import h5py
    from qai_hub.util.dataset_entries_converters import h5_to_dataset_entries

    with h5py.File(path, "r") as f:
        return h5_to_dataset_entries(f)


def write_report(store: Store, recipe: str, results: list[HubResult]) -> Path:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = store.root / "runs" / recipe / "hub" / stamp / "report.json"
    write_json_atomic(out, {"recipe": recipe, "created": stamp, "artifacts": [
        {"id": r.artifact, "device": r.device, "status": r.status, "reasons": r.reasons, "reused": r.reused,
         "location": str(r.location.relative_to(store.root)), "hub": r.section} for r in results]})
    return out
