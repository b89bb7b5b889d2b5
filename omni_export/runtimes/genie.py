"""Qualcomm Genie, the LLM runtime Qualcomm ships for phones: ``libGenie.so`` (Genie C API 1.x of QNN 2.51, inside the
installed onnxruntime-qnn wheel, next to the QNN HTP simulator) driven through ctypes.

A ``GenieDialog`` runs in its own worker process (``python -m omni_export.runtimes.genie``): a simulator crash
(a weight-shared binary kills the process on x86) becomes a ``GenieError`` instead of taking the caller down, and
everything Genie prints (its errors go to stderr, not to a return value) is captured and carried in the error. The
library needs no environment of its own: it finds ``libQnnHtp.so`` in its own folder, with no LD_LIBRARY_PATH or
ADSP path set. Paths inside ``genie_config.json`` (tokenizer, ctx-bins, backend extensions) resolve against the
working directory, so the worker runs in the bundle's folder.

The bundle contract, as measured on the simulator with hand-made graphs (``tests/runtimes/test_genie_dialog.py``):
- a ``tokenizer.json`` is required even for token queries; ``context.pad-token`` must be a valid id (Genie feeds it
  in the unused rows of an AR-N call; without it the graph's lookup fails: "Failed to execute graph. Error 1100");
- ``attention_mask`` [1, 1, AR, C] is additive: float IO gets 0 (visible) / -1000 (masked); uint16 IO gets the raw
  extremes 65535 (visible) / 0 (masked) whatever the encoding, so its zero point must be 65535. The graph attends
  over [C-AR cache slots | this call's AR rows], in that order; a call's valid rows come first, padding after;
- ``position_ids_cos`` / ``_sin`` [1, 1, AR, kv-dim/2]: cos/sin(p * rope-theta^(-2i/kv-dim)), quantized with the
  tensor's encoding for uint16 IO;
- KV update is SMART_MASK (``kv-update-method`` is deprecated in this version): the row of position p stays at slot
  p of ``past_key_{i}_in[..., p]`` / ``past_value_{i}_in[:, :, p, :]``, for every AR variant; a slot not yet
  written holds the byte 128 (uint8 KV, whatever the zero point) or leftover memory (float32 KV: nonzero garbage),
  so a graph zeroes unwritten slots rather than only masking them;
- ctx-bins may list an AR-N and an AR-1 binary: the prompt runs through AR-N, generation through AR-1 (told apart by
  tensor shapes), over one cache; except at N = C/2, where ``past_key_{i}_in`` and ``_out`` have one shape and Genie
  writes the AR-N graph's K rows in a stride the AR-1 graph does not read (the ids leave after the first). Parts of
  a model chain by tensor names only among graphs named ``*_<k>_of_<n>`` (``rename_context_graph``); a weight-shared
  binary (two graphs, one copy of weights) crashes the simulator's context load, in ``GenieDialog_create`` as in
  onnxruntime-qnn;
- Genie does not check ``n-vocab`` or ``kv-dim`` against the graph (a wrong n-vocab samples past the logits);
  ``token_query(..., logits=True)`` checks the logits size;
- a custom sampler (``sampler.type = custom``, ``callback-name``) receives the float32 logits of every generated
  position (``logitsSize`` in bytes), which is how ``token_query(..., logits=True)`` sees them.
"""
from __future__ import annotations

import ctypes
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from . import RuntimeUnavailable
from .cores import pin_process

STATUS = {0: "SUCCESS", 1: "WARNING_ABORTED", 2: "WARNING_BOUND_HANDLE", 3: "WARNING_PAUSED",
          4: "WARNING_CONTEXT_EXCEEDED", -1: "ERROR_GENERAL", -2: "ERROR_INVALID_ARGUMENT", -3: "ERROR_MEM_ALLOC",
          -4: "ERROR_INVALID_CONFIG", -5: "ERROR_INVALID_HANDLE", -6: "ERROR_QUERY_FAILED", -7: "ERROR_JSON_FORMAT",
          -8: "ERROR_JSON_SCHEMA", -9: "ERROR_JSON_VALUE", -10: "ERROR_GENERATE_FAILED",
          -11: "ERROR_GET_HANDLE_FAILED", -12: "ERROR_APPLY_CONFIG_FAILED", -13: "ERROR_SET_PARAMS_FAILED",
          -14: "ERROR_BOUND_HANDLE"}
SENTENCE_COMPLETE = 0
SAMPLER_CALLBACK = "omni_export_logits"  # the custom sampler the worker registers (token_query(..., logits=True))


class GenieError(RuntimeError):
    """Genie refused or failed: ``status`` is its return code name (or how the worker died), ``genie_message`` the
    text Genie printed meanwhile (its own words; the manifest keeps them)."""

    def __init__(self, what: str, status: str, genie_message: str):
        self.status, self.genie_message = status, genie_message
        super().__init__(f"Genie {what} failed: {status}" + (f": {genie_message}" if genie_message else ""))


def genie_library() -> Path:
    """``libGenie.so`` of the installed onnxruntime-qnn; ``RuntimeUnavailable`` where there is none."""
    try:
        import onnxruntime_qnn as q
    except ImportError:
        raise RuntimeUnavailable("onnxruntime-qnn is not installed: no libGenie.so") from None
    lib = Path(q.get_library_path()).parent / "libGenie.so"
    if not lib.is_file():
        raise RuntimeUnavailable(f"onnxruntime-qnn {getattr(q, '__version__', '?')} ships no libGenie.so")
    return lib


def write_genie_config(directory: Path, *, ctx_bins: list[str], context: int, n_vocab: int, bos: int,
                       eos: int | list[int], pad: int, kv_dim: int, pos_id_dim: int, rope_theta: float,
                       tokenizer: str = "tokenizer.json", soc_model: int, dsp_arch: str, n_threads: int = 3,
                       cpu_mask: str = "0xe0", extensions: bool = True) -> Path:
    """Write ``genie_config.json`` (dialog basic, greedy sampler) and ``htp_backend_ext_config.json`` (``soc_model``,
    ``dsp_arch`` e.g. "v79") into ``directory``; ``ctx_bins`` and ``tokenizer`` are file names in it (Genie orders
    the parts of a model by their graph names, ``rename_context_graph``). ``pad``: the id Genie feeds in the unused
    rows of an AR-N call (without one the graph's lookup fails: "Failed to execute graph. Error 1100").
    ``extensions=False`` leaves the backend extension file out of the config (it is still written)."""
    directory = Path(directory)
    missing = [f for f in [*ctx_bins, tokenizer] if not (directory / f).is_file()]
    if missing:
        raise FileNotFoundError(f"genie bundle {directory.name}: missing {', '.join(missing)}")
    htp = {"version": 1, "spill-fill-bufsize": 0, "use-mmap": True, "mmap-budget": 0, "poll": True,
           "cpu-mask": cpu_mask, "kv-dim": kv_dim, "pos-id-dim": pos_id_dim, "allow-async-init": False,
           "rope-theta": rope_theta}
    backend = {"version": 1, "type": "QnnHtp", "QnnHtp": htp}
    if extensions:
        backend["extensions"] = "htp_backend_ext_config.json"
    config = {"dialog": {
        "version": 1, "type": "basic",
        "context": {"version": 1, "size": context, "n-vocab": n_vocab, "bos-token": bos, "eos-token": eos,
                    "pad-token": pad},
        "sampler": {"version": 1, "seed": 42, "temp": 0, "top-k": 1, "top-p": 1, "greedy": True},
        "tokenizer": {"version": 1, "path": tokenizer},
        "engine": {"version": 1, "n-threads": n_threads, "backend": backend,
                   "model": {"version": 1, "type": "binary", "binary": {"version": 1, "ctx-bins": list(ctx_bins)}}}}}
    ext = {"devices": [{"soc_model": soc_model, "dsp_arch": dsp_arch,
                        "cores": [{"core_id": 0, "perf_profile": "burst", "rpc_control_latency": 100}]}],
           "memory": {"mem_type": "shared_buffer"}}
    _write_json(directory / "htp_backend_ext_config.json", ext)
    return _write_json(directory / "genie_config.json", config)


ORT_GRAPH_NAME = re.compile(rb"QNNExecutionProvider_QNNExecutionProvider_\d+_\d+_\d+")


def rename_context_graph(path: Path, prefix: str, k: int, n: int) -> str:
    """Rename the one graph of an onnxruntime-qnn context binary to ``<prefix>...<_k_of_n>`` (padded with "x" to
    the length of ORT's name, which it replaces in place): Genie chains the parts of a model by tensor names only
    among graphs named ``*_<k>_of_<n>``, and ORT has no option for the QNN graph name. The renamed binary no longer
    matches its ``*_ctx.onnx`` wrapper (ORT finds the graph by the old name). Returns the new name."""
    path = Path(path)
    data = path.read_bytes()
    names = set(ORT_GRAPH_NAME.findall(data))
    if len(names) != 1:
        raise ValueError(f"{path.name}: expected one onnxruntime-qnn graph name, found {len(names)}")
    (old,) = names
    tail = f"_{k}_of_{n}".encode()
    head = prefix.encode()
    if len(head) + len(tail) > len(old):
        raise ValueError(f"graph name prefix {prefix!r} is longer than {len(old) - len(tail)} characters")
    new = head + b"x" * (len(old) - len(head) - len(tail)) + tail
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data.replace(old, new))
    os.replace(tmp, path)
    return new.decode()


def _write_json(path: Path, obj) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)
    return path


class GenieDialog:
    """One Genie dialog over a bundle's ``genie_config.json``, in a worker process. Queries continue the dialog
    (Genie keeps its KV cache between them); ``reset()`` starts over."""

    def __init__(self, config_path: Path):
        self.config_path = Path(config_path).resolve()
        lib = genie_library()
        if not self.config_path.is_file():
            raise FileNotFoundError(f"no Genie config at {self.config_path}")
        self._log = tempfile.TemporaryFile()
        root = str(Path(__file__).resolve().parents[2])  # the worker imports this package from where it is now
        env = os.environ | {"PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        self._proc = subprocess.Popen([sys.executable, "-m", __name__, str(lib)], cwd=self.config_path.parent,
                                      env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log)
        try:
            self._call("create", self.config_path.read_text())
        except BaseException:
            self.close()
            raise

    def token_query(self, ids: list[int], n_new: int, logits: bool = False):
        """Feed ``ids``; the ids Genie generates after them (at most ``n_new``; fewer where it stops at an EOS id;
        a context that fills up is a ``GenieError`` WARNING_CONTEXT_EXCEEDED). With ``logits=True`` an EOS id Genie
        stopped at (sampled, never emitted by Genie) ends the list, with its logits row.
        ``logits=True``: ``(ids, logits [n, V] float32)``, the logits each generated id was chosen from, read by a
        custom sampler that takes their argmax (the bundle's own sampler is swapped out for this query only)."""
        out, rows = self._call("token_query", [int(i) for i in ids], int(n_new), bool(logits))
        return (out, rows) if logits else out

    def query(self, text: str, n_new: int) -> str:
        """Genie's own tokenizer path: ``text`` in, at most ``n_new`` generated tokens' text out."""
        return self._call("query", text, int(n_new))

    def reset(self) -> None:
        self._call("reset")

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self._send(("close",))
                self._proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        self._log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _send(self, msg) -> None:
        pickle.dump(msg, self._proc.stdin)
        self._proc.stdin.flush()

    def _printed(self, since: int) -> str:
        self._log.seek(since)
        text = self._log.read().decode(errors="replace")
        lines = [ln.strip() for ln in text.splitlines() if ln.strip() and "LIBNATIVE" not in ln]
        return " | ".join(lines)[-2000:]

    def _call(self, what: str, *args):
        since = self._log.seek(0, os.SEEK_END)
        try:
            self._send((what, *args))
            reply = pickle.load(self._proc.stdout)
        except (EOFError, BrokenPipeError, pickle.UnpicklingError):
            code = self._proc.wait()
            how = f"the Genie process died (signal {-code})" if code < 0 else f"the Genie process exited ({code})"
            raise GenieError(what, how, self._printed(since)) from None
        if reply[0] == "ok":
            return reply[1]
        _, status, detail = reply
        text = self._printed(since)
        raise GenieError(what, status, "; ".join(t for t in (detail, text) if t))


# ---- the worker process: ctypes over libGenie.so ----

_QUERY_CB = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p)
_TOKEN_CB = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_uint32), ctypes.c_uint32, ctypes.c_int, ctypes.c_void_p)
_SAMPLER_CB = ctypes.CFUNCTYPE(None, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_uint32, ctypes.POINTER(ctypes.c_int32),
                               ctypes.c_void_p)


class _Failed(Exception):
    def __init__(self, status: str, detail: str = ""):
        super().__init__(status)
        self.status, self.detail = status, detail


class _Worker:
    def __init__(self, lib_path: str):
        self.lib = ctypes.CDLL(lib_path)
        for name in ("GenieDialogConfig_createFromJson", "GenieDialog_create", "GenieDialog_tokenQuery",
                     "GenieDialog_query", "GenieDialog_reset", "GenieDialog_free", "GenieDialogConfig_free",
                     "GenieDialog_setMaxNumTokens", "GenieDialog_getSampler", "GenieSamplerConfig_createFromJson",
                     "GenieSampler_applyConfig", "GenieSamplerConfig_free", "GenieSampler_registerUserDataCallback"):
            getattr(self.lib, name).restype = ctypes.c_int32
        self.config = self.dialog = None
        self.vocab, self.bad_logits = 0, ""
        self.rows: list[np.ndarray] = []
        self._sampler_cb = _SAMPLER_CB(self._sample)
        self._check("GenieSampler_registerUserDataCallback", SAMPLER_CALLBACK.encode(), self._sampler_cb, None)

    def _check(self, fn: str, *args) -> int:
        rc = getattr(self.lib, fn)(*args)
        if rc != 0:  # warnings too: a context that fills up (4) ends the generation short of the steps asked
            raise _Failed(STATUS.get(rc, f"status {rc}"), f"{fn} returned {rc}")
        return rc

    def _sample(self, size, logits, n_tokens, tokens, _user):
        """The custom sampler: greedy argmax over the logits Genie hands over (float32: ``size`` is in bytes)."""
        row = np.ctypeslib.as_array(ctypes.cast(logits, ctypes.POINTER(ctypes.c_float)), (size // 4,)).copy()
        if self.vocab and row.size != self.vocab:  # never guess another layout (e.g. 16-bit logits)
            self.bad_logits = f"sampler got {size} bytes of logits, not {self.vocab} float32"
        self.rows.append(row)
        for k in range(n_tokens):
            tokens[k] = int(row.argmax())

    def create(self, config_text: str):
        cfg = json.loads(config_text)
        self.vocab = int(cfg["dialog"]["context"]["n-vocab"])
        # "type" spelled out: applying a sampler config without it keeps the custom type in force (measured)
        self.bundle_sampler = json.dumps({"sampler": {"type": "basic"} | cfg["dialog"].get("sampler", {"version": 1})})
        self.config = ctypes.c_void_p()
        self._check("GenieDialogConfig_createFromJson", config_text.encode(), ctypes.byref(self.config))
        self.dialog = ctypes.c_void_p()
        self._check("GenieDialog_create", self.config, ctypes.byref(self.dialog))

    def _use_sampler(self, sampler_json: str):
        handle, cfg = ctypes.c_void_p(), ctypes.c_void_p()
        self._check("GenieDialog_getSampler", self.dialog, ctypes.byref(handle))
        self._check("GenieSamplerConfig_createFromJson", sampler_json.encode(), ctypes.byref(cfg))
        try:
            self._check("GenieSampler_applyConfig", handle, cfg)
        finally:
            self.lib.GenieSamplerConfig_free(cfg)

    def token_query(self, ids: list[int], n_new: int, logits: bool):
        out: list[int] = []

        def on_tokens(resp, n, code, _):
            out.extend(resp[i] for i in range(n))

        cb = _TOKEN_CB(on_tokens)
        self.rows, self.bad_logits = [], ""
        self._check("GenieDialog_setMaxNumTokens", self.dialog, ctypes.c_uint32(n_new))
        if logits:
            self._use_sampler(json.dumps({"sampler": {"version": 1, "type": "custom",
                                                      "callback-name": SAMPLER_CALLBACK}}))
        try:
            arr = (ctypes.c_uint32 * len(ids))(*ids)
            self._check("GenieDialog_tokenQuery", self.dialog, arr, ctypes.c_uint32(len(ids)),
                        SENTENCE_COMPLETE, cb, None)
        finally:
            if logits:
                self._use_sampler(self.bundle_sampler)
        if self.bad_logits:
            raise _Failed("UNSUPPORTED_LOGITS", self.bad_logits)
        if not logits and self.rows:
            raise _Failed("SAMPLER_NOT_RESTORED", "the bundle's sampler did not replace the logits sampler")
        if logits and len(self.rows) == len(out) + 1 and all(int(r.argmax()) == t for r, t in zip(self.rows, out)):
            out.append(int(self.rows[-1].argmax()))  # the end token ends the dialog: sampled, but never emitted
        if logits and len(self.rows) != len(out):
            raise _Failed("LOGITS_MISMATCH", f"{len(out)} ids but the sampler saw {len(self.rows)} logits rows")
        if not logits:
            return out, None
        return out, np.stack(self.rows) if self.rows else np.zeros((0, self.vocab), np.float32)

    def query(self, text: str, n_new: int) -> str:
        pieces: list[bytes] = []
        cb = _QUERY_CB(lambda s, code, _: pieces.append(s or b""))
        self._check("GenieDialog_setMaxNumTokens", self.dialog, ctypes.c_uint32(n_new))
        self._check("GenieDialog_query", self.dialog, text.encode(), SENTENCE_COMPLETE, cb, None)
        return b"".join(pieces).decode(errors="replace")

    def reset(self):
        self._check("GenieDialog_reset", self.dialog)

    def close(self):
        if self.dialog:
            self.lib.GenieDialog_free(self.dialog)
        if self.config:
            self.lib.GenieDialogConfig_free(self.config)


def _serve(lib_path: str) -> None:
    """Worker loop: pickled (command, *args) on stdin, ("ok", result) / ("error", status, detail) on the original
    stdout; Genie's own prints go to stderr (fd 1 is pointed there), which the parent keeps."""
    pin_process()  # the worker runs nothing but Genie on the simulator (runtimes.cores)
    reply = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    worker = None
    while True:
        try:
            msg = pickle.load(requests)
        except EOFError:
            break
        what, args = msg[0], msg[1:]
        if what == "close":
            break
        try:
            worker = worker or _Worker(lib_path)
            out = ("ok", getattr(worker, what)(*args))
        except _Failed as e:
            out = ("error", e.status, e.detail)
        except Exception as e:  # a bug here, not Genie's refusal: say what it was
            out = ("error", type(e).__name__, str(e))
        sys.stderr.flush()
        pickle.dump(out, reply)
        reply.flush()
    if worker is not None:
        worker.close()


if __name__ == "__main__":
    _serve(sys.argv[1])
