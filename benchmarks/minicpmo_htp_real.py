"""MiniCPM-o 4.5's vocoder stages at the real sizes (preset ``4.5``, seeded weights) as fp16 QNN context binaries on
the HTP simulator: one recorded call per stage, each output against eager fp32 on the same feed.

The recipes' HTP parity traces whole utterances (an encoder chunk, ten batch-2 DiT calls per chunk, HiFT windows);
at the real sizes one call of the simulator takes minutes to hours, so this benchmark measures what one call says:
the stage's feed is recorded from the family's host loop (eager fp32, late in a 4-second utterance, caches filled,
as ``minicpmo_cost.py`` records it), the project's targets build the artifacts exactly as a recipe does (``onnx``
fp32, then ``qnn_context`` fp16 for SM8750 from it), and the context binary runs that feed on the QNN HTP simulator.
Per output: SNR of the HTP output and of the fp32 ONNX on ORT CPU against eager fp32; with ``--qdq`` also the
calibrated w8a16 QDQ graph on ORT CPU (ranges from every call of the same stage over another utterance, seed 1: the
shipped recipes keep these stages fp16, and this says whether w8a16 would hold at the real sizes). Compile time and the
simulator's wall time per call are recorded; a stage whose call exceeds ``--budget-s`` is run in a child process
and recorded as not finished, with the time it was given.

    nice -n 10 python benchmarks/minicpmo_htp_real.py                      # flow encoder and DiT
    nice -n 10 python benchmarks/minicpmo_htp_real.py --stages hift --budget-s 3600
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from omni_export.artifacts.atomic import write_json_atomic
from omni_export.artifacts.hashing import path_bytes
from omni_export.artifacts.provenance import git_revision, toolchain
from omni_export.calibration.dataset import write_set
from omni_export.devices import get_device
from omni_export.exporters import ExportRequest
from omni_export.exporters.onnx import TARGET as ONNX
from omni_export.exporters.qdq_onnx import TARGET as QDQ
from omni_export.exporters.qnn_context import TARGET as QNN
from omni_export.families import build_model
from omni_export.families.minicpmo.config import SILENCE_TOKEN
from omni_export.families.minicpmo.graphs import eager
from omni_export.families.minicpmo.vocoder import DiTStepComponent, FlowEncoderComponent, HiFTComponent
from omni_export.parity.metrics import snr_db
from omni_export.schemes import get_scheme

RESULTS = Path(__file__).resolve().parent / "results"
STAGES = {"flow_encoder": FlowEncoderComponent, "dit_step": DiTStepComponent, "hift": HiFTComponent}


def record_feeds(bundle, context: int, seconds: int, seed: int = 0) -> dict:
    """Every call's feed per stage from the host loops (eager fp32) over ``seconds`` of random codes."""
    cfg = bundle.config
    enc, dit, hift = (STAGES[n](bundle, context=context) for n in STAGES)
    host = enc.host
    rng = np.random.default_rng(seed)
    n_tok = int(seconds * cfg.hift.sampling_rate / cfg.hift.samples_per_frame / cfg.encoder.up_stride)
    tokens = np.concatenate(([SILENCE_TOKEN] * 3, rng.integers(0, cfg.encoder.vocab_size, n_tok - 3))).astype(np.int64)
    feeds = {"flow_encoder": [], "dit_step": [], "hift": []}
    keep = lambda name: lambda f: feeds[name].append({k: v.copy() for k, v in f.items()})  # noqa: E731
    mus, _ = host.encode(host.chunks(tokens), eager(enc.graph), record=keep("flow_encoder"))
    mels, _ = host.dit(mus, eager(dit.graph), record=keep("dit_step"))
    host.hift.stream({"hift": eager(hift.graph)}, np.concatenate(mels[1:], axis=1),
                     record=lambda kind, f: keep("hift")(f) if kind == "hift" else None)
    comps = {"flow_encoder": enc, "dit_step": dit, "hift": hift}
    return {n: (comps[n], feeds[n]) for n in feeds}


def _htp_call(ctx_path: str, out_names, device_name: str, feed: dict, q) -> None:
    from omni_export.runtimes.ort import qnn_htp
    run = qnn_htp(Path(ctx_path), out_names, get_device(device_name), fp16=True)
    t = time.perf_counter()
    outs = run(feed)
    q.put((time.perf_counter() - t, outs))


def stage(name: str, comp, feed: dict, device, budget_s: float, log, calib=None, htp: bool = True) -> dict:
    (g,) = comp.graphs()
    names = [s.name for s in g.outputs]
    with torch.no_grad():
        ref = eager(g)(feed)
    r: dict = {"inputs": {s.name: list(s.shape) for s in g.inputs}}
    with tempfile.TemporaryDirectory(prefix=f"htp-{name}-") as tmp:
        tmp = Path(tmp)
        (tmp / "onnx").mkdir()
        (tmp / "ctx").mkdir()
        t = time.perf_counter()
        onnx = ONNX.export(ExportRequest(comp, get_scheme("fp32"), device, None, None), tmp / "onnx")
        r["onnx_export_s"] = round(time.perf_counter() - t, 1)
        r["fp32_onnx_mb"] = round(sum(path_bytes(onnx.dir / f) for f in onnx.files.values()) / 1e6, 1)
        cpu = ONNX.execution(onnx, comp, device).run(feed)
        r["ort_cpu_fp32_snr_db"] = {n: round(snr_db(a, b), 1) for n, a, b in zip(names, ref, cpu)}
        if calib is not None:
            (tmp / "calibration").mkdir()
            cs = write_set(tmp / "calibration", calib, len(calib), len(calib), f"{name} seed-1 utterance", "-")
            (tmp / "qdq").mkdir()
            t = time.perf_counter()
            qdq = QDQ.export(ExportRequest(comp, get_scheme("w8a16"), device, cs, lambda *_: onnx), tmp / "qdq")
            got = QDQ.execution(qdq, comp, device).run(feed)
            r["ort_cpu_qdq_w8a16"] = {"calibration_calls": len(calib), "export_s": round(time.perf_counter() - t, 1),
                                      "snr_db": {n: round(snr_db(a, b), 1) for n, a, b in zip(names, ref, got)}}
            log(f"{name}: CPU-QDQ w8a16 {r['ort_cpu_qdq_w8a16']}")
        if not htp:
            return r
        t = time.perf_counter()
        ctx = QNN.export(ExportRequest(comp, get_scheme("fp16"), device, None, lambda *_: onnx), tmp / "ctx")
        r["compile_s"] = round(time.perf_counter() - t, 1)
        r["context_binary_mb"] = round(sum(path_bytes(ctx.dir / f) for f in ctx.files.values()) / 1e6, 1)
        log(f"{name}: compiled in {r['compile_s']} s; one call on the HTP simulator (budget {budget_s:.0f} s)")
        q = mp.get_context("spawn").Queue()
        p = mp.get_context("spawn").Process(target=_htp_call, args=(str(ctx.path(g.name)), names, device.name,
                                                                     feed, q))
        t = time.perf_counter()
        p.start()
        try:
            took, outs = q.get(timeout=budget_s)
        except Exception:  # noqa: BLE001 - queue.Empty: the call did not finish within the budget
            p.kill()
            r["htp"] = {"finished": False, "budget_s": budget_s, "ran_s": round(time.perf_counter() - t, 1)}
            return r
        p.join()
        r["htp"] = {"finished": True, "call_s": round(took, 1),
                    "snr_db": {n: round(snr_db(a, b), 1) for n, a, b in zip(names, ref, outs)}}
    return r


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="4.5")
    ap.add_argument("--stages", default="flow_encoder,dit_step")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--seconds", type=int, default=4)
    ap.add_argument("--device", default="galaxy_s25")
    ap.add_argument("--budget-s", type=float, default=2400.0, help="wall-clock limit of one simulator call")
    ap.add_argument("--qdq", action="store_true", help="also the calibrated w8a16 QDQ graph on ORT CPU")
    ap.add_argument("--skip-htp", action="store_true", help="no context binary or simulator call")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    out_path = a.out or RESULTS / f"minicpmo_htp_{a.preset}.json"
    t0 = time.perf_counter()

    def log(msg):
        print(f"[{time.perf_counter() - t0:7.1f}s] {msg}", flush=True)

    device = get_device(a.device)
    bundle = build_model("minicpmo", a.preset, seed=0)
    recorded = record_feeds(bundle, a.context, a.seconds)
    calib = record_feeds(bundle, a.context, a.seconds, seed=1) if a.qdq else {}
    log("recorded feeds: " + ", ".join(f"{n} {len(f)} calls" for n, (_, f) in recorded.items()))
    prior = json.loads(out_path.read_text()).get("stages", {}) if out_path.is_file() else {}
    res = dict(prior)
    for name in [s for s in a.stages.split(",") if s]:
        comp, feeds = recorded[name]
        got = stage(name, comp, feeds[-1], device, a.budget_s, log, calib[name][1] if a.qdq else None,
                    not a.skip_htp)
        res[name] = {**res.get(name, {}), "feed": f"call {len(feeds)} of {len(feeds)} (the utterance's last, "
                                                  f"caches filled)", **got}
        log(f"{name}: {json.dumps(res[name].get('htp'))}")
        write_json_atomic(out_path, {
            "benchmark": "minicpmo vocoder stages, fp16 context binaries on the QNN HTP simulator, one call each",
            "preset": a.preset, "seed": 0, "device": device.name, "soc_model": device.soc_model,
            "utterance_s": a.seconds, "reference": "eager fp32 on the same recorded feed",
            "load_avg_1min_end": round(os.getloadavg()[0], 2), "stages": res, "toolchain": toolchain(),
            "source_revision": git_revision()})
    log(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
