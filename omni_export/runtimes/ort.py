"""ONNX Runtime on the CPU, and the QNN HTP backend of onnxruntime-qnn (the Hexagon NPU simulated on x86)."""
from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path

import numpy as np

from ..errors import MissingDependency, UnsupportedError
from . import RuntimeUnavailable
from .cores import one_core


def _ort():
    try:
        import onnxruntime as ort
    except ImportError:
        raise MissingDependency("onnxruntime is not installed (pip install onnxruntime)") from None
    ort.set_default_logger_severity(3)
    return ort


def require_ort() -> None:
    """Raise ``MissingDependency`` unless onnxruntime imports: an execution whose sessions are made at their first
    call checks this up front, so a missing runtime is exit 3 even when every measurement is reused."""
    _ort()


def _runner(sess, output_names):
    names = list(output_names)

    def run(feed):
        return sess.run(names, {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in feed.items()})

    return run


# A QDQ graph whose weight files are at most this size has its weights' DequantizeLinear folded into fp32 constants
# when the session is made (at most 4x this in fp32); a larger one (a full-size part) dequantizes them on every call,
# unless its session is the only one open (``ort_cpu(alone=True)``: parity's one part at a time, or a component's
# only graph).
FOLD_WEIGHTS_MAX_BYTES = 256 * 2**20


def cpu_session(path: Path, threads: int | None = None, optimize: bool = True, providers=None,
                fold_weights: bool = False):
    """An ORT CPU session: ``threads`` intra-op threads, else ``OMNI_EXPORT_THREADS``, else min(2, cores);
    ``optimize=False``: no graph optimization (the graph runs as written). ``fold_weights`` (a QDQ graph): constant
    folding may dequantize the weights once (``session.disable_quant_qdq``, which lets it fold DequantizeLinear) at the
    basic optimization level, whose rewrites keep every output bit-identical to the default QDQ-aware session: the
    folded constants are what the same DequantizeLinear kernel gives on every call, and no fusion that reorders
    arithmetic runs (the full level's does: 0.06 apart on the SmolLM2 decode step's logits). Where float nodes are left
    (fp16 islands) the default session can fuse across them and the basic level does not: such a graph's folded
    session serves only once it has matched the default one (``verified_fold``, ``exporters.base.foldable``).
    ``tests/exporters/test_qdq_cpu_fold.py`` and the SmolLM2 recipe test check the outputs are identical."""
    ort = _ort()
    so = ort.SessionOptions()
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    elif fold_weights:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        so.add_session_config_entry("session.disable_quant_qdq", "1")
    so.intra_op_num_threads = threads or int(os.environ.get("OMNI_EXPORT_THREADS") or min(2, os.cpu_count() or 1))
    so.log_severity_level = 3
    # no memory arena: a chain of parts keeps one session per part open, and each arena would hold its part's peak
    # (a QDQ part's weights dequantized to fp32) for good. Full-size decode step, 4 QDQ parts, 4 steps
    # (benchmarks/ort_arena.py, results/ort_arena_spark_full_decode.json): 2.86 GiB and 3.17 s a step without
    # arenas, 5.05 GiB and 2.36 s with, 2.96 GiB and 2.69 s with arenas shrunk after every run, 4.04 GiB and 1.84 s
    # with one arena shared by the sessions (which would then keep the largest footprint of any later session in
    # this process). Memory first: the full-size budget is 8 GiB.
    so.enable_cpu_mem_arena = False
    return ort.InferenceSession(str(path), so, providers=providers or ["CPUExecutionProvider"])


def ort_cpu(path: Path, output_names, qdq: bool = False, alone: bool = False, verify: bool = False):
    """A runner on ORT CPU; ``qdq``: a QDQ graph, its weights dequantized once when they are small enough, or whatever
    their size when the session is ``alone``: the only graph's session parity holds open (``parity.execute.part_major``
    runs a chain of full-size parts one session at a time: one part's fp32 weights, 1.6-1.9 GB, instead of four).
    ``verify``: the folded session serves only once it has given the default session's outputs bit for bit
    (``verified_fold``)."""
    path = Path(path)
    small = qdq and (alone or sum(p.stat().st_size for p in path.parent.glob(path.name + "*")) <= FOLD_WEIGHTS_MAX_BYTES)
    if small and verify:
        return verified_fold(path, output_names)
    return _runner(cpu_session(path, fold_weights=small), output_names)


VERIFIED_CALLS = 2


def verified_fold(path: Path, output_names, calls: int = VERIFIED_CALLS):
    """A runner for a QDQ graph with float nodes left in it (fp16 islands), where the folded session may or may not
    compute what the default session does: for the first ``calls`` calls both run and the default session's outputs
    are returned; the folded session serves every later call only if all its outputs were bit-identical, else the
    default session does. Measured on the trained models' w8a16 builds (6 calibration inputs each): Gemma 3's decode
    step (float residual Adds and RMSNorms) identical, a step 0.53 -> 0.12 s (its 466 MB of weight files are over
    ``FOLD_WEIGHTS_MAX_BYTES``: folded as its component's only graph, ``exporters.base.qdq_chain``); the prefills
    (a float down_proj too) 0.08 (SmolLM2) and 0.13 (Gemma 3) apart in their outputs, so they keep the default
    session."""
    names = list(output_names)
    state = {"sessions": (cpu_session(path), cpu_session(path, fold_weights=True)), "left": calls, "same": True}

    def run(feed):
        f = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in feed.items()}
        if "sessions" not in state:
            return state["chosen"].run(names, f)
        default, folded = state["sessions"]
        a = default.run(names, f)
        state["same"] = state["same"] and all(np.array_equal(x, y) for x, y in zip(a, folded.run(names, f)))
        state["left"] -= 1
        if state["left"] <= 0 or not state["same"]:
            state["chosen"] = folded if state["same"] else default
            del state["sessions"]  # the other session's weights are released
        return a

    run.verified = state  # ``chosen`` names the session that served the later calls
    return run


@functools.lru_cache(maxsize=1)
def _qnn_devices():
    ort = _ort()
    try:
        import onnxruntime_qnn as q
    except ImportError:
        raise RuntimeUnavailable("onnxruntime-qnn is not installed: no QNN HTP simulator") from None
    try:
        ort.register_execution_provider_library("QNNExecutionProvider", q.get_library_path())
    except Exception as e:  # already registered in this process is fine
        if "already" not in str(e).lower():
            raise RuntimeUnavailable(f"cannot register the QNN execution provider: {e}") from None
    devs = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
    if not devs:
        raise RuntimeUnavailable("the QNN execution provider lists no device")
    return q, devs


def require_qnn() -> None:
    """Raise ``RuntimeUnavailable`` unless the QNN HTP backend can start here (before any session is made)."""
    _qnn_devices()


def htp_session_options(device, fp16: bool = False, context_out: Path | None = None, config: dict | None = None,
                        provider_options: dict | None = None):
    """Session options for the HTP backend with CPU fallback disabled: an op HTP cannot run is an error.
    ``config``: extra session config entries (e.g. ``ep.share_ep_contexts`` for a weight-shared context);
    ``provider_options``: extra QNN EP options (e.g. ``offload_graph_io_quantization``)."""
    ort = _ort()
    q, devs = _qnn_devices()
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    for k, v in (config or {}).items():
        so.add_session_config_entry(k, v)
    if context_out is not None:
        so.add_session_config_entry("ep.context_enable", "1")
        so.add_session_config_entry("ep.context_file_path", str(context_out))
        so.add_session_config_entry("ep.context_embed_mode", "0")
    opts = {"backend_path": q.get_qnn_htp_path(), "soc_model": str(device.soc_model), "htp_arch": str(device.htp_arch)}
    if context_out is not None:
        # compile and write the context binary only: on x86 the session would otherwise also load the finalized graph
        # into the HTP simulator for inference, which nobody runs from a compile session
        opts["enable_htp_prepare_only"] = "1"
    if fp16:
        opts["enable_htp_fp16_precision"] = "1"
    opts.update(provider_options or {})
    so.add_provider_for_devices(devs, opts)
    return so


def htp_session(path: Path, device, fp16: bool = False, context_out: Path | None = None, config: dict | None = None,
                root: Path | None = None, provider_options: dict | None = None):
    """A compile (``context_out``) runs in ``root`` (default: the source's folder) with paths relative to it: ORT
    names the EPContext partition from the model's path and QNN records it in the binary, so absolute paths made the
    files depend on the store's location (tests/test_end_to_end.py builds the same recipe from two directories).
    Graphs compiled into one weight-shared context need distinct names: their sources, each ``model.onnx`` in its
    own step directory, are then named relative to a common ``root`` above those directories."""
    ort = _ort()
    where, name = contextlib.nullcontext(), str(path)
    if context_out is not None:
        path, context_out = Path(path).resolve(), Path(context_out).resolve()
        root = Path(root).resolve() if root is not None else path.parent
        where, context_out = contextlib.chdir(root), Path(os.path.relpath(context_out, root))
        name = os.path.relpath(path, root)
    so = htp_session_options(device, fp16, context_out, config, provider_options)
    try:
        with where:
            return ort.InferenceSession(name, so)
    except Exception as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UnsupportedError(f"QNN HTP ({device.chipset}) refused {Path(path).name}: {msg[:300]}") from None


def simulator_runner(make_session, runner, output_names):
    """``runner(session, output_names)`` over the HTP simulator session ``make_session()``, the session made and every
    call run on one core (``runtimes.cores``: the threads the simulator starts when the session is made spin in every
    call unless they were started there too)."""
    with one_core():
        run = runner(make_session(), output_names)

    def pinned(feed):
        with one_core():
            return run(feed)
    return pinned


def qnn_htp(path: Path, output_names, device, fp16: bool = False):
    return simulator_runner(lambda: htp_session(path, device, fp16), _runner, output_names)
