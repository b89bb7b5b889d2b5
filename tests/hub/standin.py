"""A local stand-in of the Qualcomm AI Hub REST API, for tests only (nothing in omni_export imports it).

It speaks the real protocol of the installed ``qai-hub`` client: protobuf bodies from ``qai_hub.public_api_pb2``,
token authentication, the upload / download URLs the API hands out (pointed back at this server), datasets as the
client's own h5 layout. Jobs run in a worker thread and step through the service's job states:

* compile: loads the uploaded ONNX in ONNX Runtime (a graph ORT refuses fails the job) and produces a target model
  of the requested runtime that refers back to the source graph;
* inference: executes the source graph on ONNX Runtime CPU for every sample of the input dataset, so the outputs
  are real numbers; ``perturb`` adds noise of that relative size to every output (a broken device in one test mode);
* profile: times those ORT CPU runs on this host; the numbers are marked as stand-in numbers (``hub_version``
  ``standin`` and the one layer's name), never device numbers.

The server listens on 127.0.0.1 only and shuts itself down after ``max_seconds``.
"""
from __future__ import annotations

import http.server
import io
import itertools
import resource
import threading
import time
import zipfile
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import h5py
import numpy as np
from qai_hub import public_api_pb2 as pb
from qai_hub.util.dataset_entries_converters import dataset_entries_to_h5, h5_to_dataset_entries
from requests_toolbelt.multipart.decoder import MultipartDecoder

from omni_export.runtimes.ort import cpu_session

STANDIN_MARK = "standin: host ONNX Runtime CPU timings, not a device"
DEVICES = (
    ("Samsung Galaxy S25 (Family)", "15", ["chipset:qualcomm-snapdragon-8-elite-for-galaxy", "framework:qnn",
                                           "framework:onnx", "os:android", "vendor:samsung", "format:phone"]),
    ("Samsung Galaxy S24 (Family)", "14", ["chipset:qualcomm-snapdragon-8gen3", "framework:qnn", "framework:onnx",
                                           "os:android", "vendor:samsung", "format:phone"]),
)
RUNTIME_MODEL_TYPE = {"qnn_context_binary": pb.MODEL_TYPE_QNN_CONTEXT_BINARY, "qnn_dlc": pb.MODEL_TYPE_QNN_DLC}


class _Error(Exception):
    def __init__(self, code: int, msg: str):
        super().__init__(msg)
        self.code = code


class StandIn:
    def __init__(self, token: str, workdir: Path, perturb: float = 0.0, max_seconds: float = 600.0,
                 step_seconds: float = 0.05):
        self.token, self.dir, self.perturb = token, Path(workdir), perturb
        self.max_seconds, self.step_seconds = max_seconds, step_seconds
        self.models: dict[str, dict] = {}
        self.datasets: dict[str, dict] = {}
        self.jobs: dict[str, dict] = {}
        self.calls: list[tuple[str, str]] = []
        self.headers_seen: list[str] = []
        self.lock = threading.Lock()
        self._ids = itertools.count(1)

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def __enter__(self):
        standin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                standin._handle(self, "GET")

            def do_POST(self):
                standin._handle(self, "POST")

            def do_PUT(self):
                standin._handle(self, "PUT")

            def do_PATCH(self):
                standin._handle(self, "PATCH")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.timer = threading.Timer(self.max_seconds, self.server.shutdown)
        self.timer.daemon = True
        self.timer.start()
        return self

    def __exit__(self, *exc):
        self.timer.cancel()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)

    def write_client_ini(self, path: Path, token: str | None = None) -> Path:
        path.write_text(f"[api]\napi_token = {self.token if token is None else token}\napi_url = {self.url}\n"
                        f"web_url = {self.url}/web\nverbose = False\n")
        return path

    def count(self, method: str, path: str, prefix: bool = False) -> int:
        return sum(1 for m, p in self.calls if m == method and (p.startswith(path) if prefix else p == path))

    # -- HTTP plumbing -------------------------------------------------------------------------------------------
    def _new_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids):06d}"

    @staticmethod
    def _body(h) -> bytes:
        if h.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = io.BytesIO()
            while True:
                size = int(h.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    h.rfile.readline()
                    return out.getvalue()
                out.write(h.rfile.read(size))
                h.rfile.readline()
        return h.rfile.read(int(h.headers.get("Content-Length") or 0))

    def _handle(self, h, method: str):
        u = urlparse(h.path)
        path, query = u.path.strip("/"), parse_qs(u.query)
        body = self._body(h)
        with self.lock:
            self.calls.append((method, path))
            self.headers_seen.append(h.headers.get("Authorization", ""))
        try:
            if path.startswith("api/"):
                if h.headers.get("Authorization") != f"token {self.token}":
                    raise _Error(401, "bad token")
                code, payload, headers = 200, self._api(method, path[len("api/v1/"):].split("/"), query, body, h), {}
                ctype = "application/x-protobuf"
                payload = payload.SerializeToString()
            elif path.startswith("files/"):
                code, payload, headers = 200, self._files(method, path.split("/")[1:], body, h), {}
                ctype = "application/octet-stream"
                if method == "PUT":
                    headers["ETag"] = '"standin-etag"'
            else:
                raise _Error(404, f"no route {path}")
        except _Error as e:
            code, payload, ctype, headers = e.code, str(e).encode(), "text/plain", {}
        except Exception as e:  # a stand-in bug: 400 so the client does not retry for half a minute
            code, payload, ctype, headers = 400, f"stand-in error: {type(e).__name__}: {e}".encode(), "text/plain", {}
        h.send_response(code)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(payload)))
        for k, v in headers.items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(payload)

    # -- the REST API ------------------------------------------------------------------------------------------------
    def _api(self, method, parts, query, body, h):
        parts = [p for p in parts if p]
        route = (method, parts[0], len(parts))
        if route == ("GET", "users", 3):
            return pb.User(id=1, email="standin@example.invalid")
        if route == ("GET", "devices", 1):
            name = (query.get("name") or [""])[0]
            devs = [pb.Device(name=n, os=o, attributes=a) for n, o, a in DEVICES if not name or n == name]
            return pb.DeviceList(devices=devs, total_query_count=len(devs))
        if route == ("POST", "models", 1):
            m = pb.Model()
            m.ParseFromString(body)
            m.model_id = self._new_id("m")
            m.creation_time.GetCurrentTime()
            self.models[m.model_id] = {"pb": m, "onnx": None}
            return pb.CreateUpdateResponse(id=m.model_id)
        if parts[0] == "models":
            rec = self._get(self.models, parts[1])
            if route == ("GET", "models", 3) and parts[2] == "multipart_upload":
                return pb.FileUploadResponse(multipart_url=pb.FileMultipartUploadURL(
                    urls=[f"{self.url}/files/model/{parts[1]}/0"], upload_id=f"up-{parts[1]}", max_part_size=1 << 40))
            if route == ("POST", "models", 3) and parts[2] == "multipart_upload":
                done = pb.FileMultipartUploadComplete()
                done.ParseFromString(body)
                if done.etags != ['"standin-etag"']:
                    raise _Error(400, f"unexpected etags {list(done.etags)}")
                self._unpack(rec, parts[1])
                return pb.CreateUpdateResponse(id=parts[1])
            if route == ("GET", "models", 2):
                return rec["pb"]
        if route == ("POST", "datasets", 1):
            d = pb.Dataset()
            d.ParseFromString(body)
            d.dataset_id = self._new_id("d")
            self._stamp(d)
            self.datasets[d.dataset_id] = {"pb": d, "h5": None}
            return pb.CreateUpdateResponse(id=d.dataset_id, creation_time=d.creation_time,
                                           expiration_time=d.expiration_time)
        if parts[0] == "datasets":
            rec = self._get(self.datasets, parts[1])
            if route == ("GET", "datasets", 3) and parts[2] == "upload_url":
                return pb.FileUploadResponse(url=pb.FileUploadURL(url=f"{self.url}/files/dataset/{parts[1]}",
                                                                  file_field_name="file"))
            if route == ("PATCH", "datasets", 2):
                if rec["h5"] is None:
                    raise _Error(400, "dataset upload not received")
                rec["pb"].file_upload_complete = True
                return pb.CreateUpdateResponse(id=parts[1])
            if route == ("GET", "datasets", 2):
                return rec["pb"]
            if route == ("GET", "datasets", 3) and parts[2] == "download_data":
                return pb.FileDownloadResponse(url=pb.FileDownloadURL(url=f"{self.url}/files/dataset/{parts[1]}",
                                                                      filename=f"{parts[1]}.h5"))
        if route == ("POST", "jobs", 1):
            return self._create_job(body)
        if parts[0] == "jobs":
            rec = self._get(self.jobs, parts[1])
            with self.lock:
                if route == ("GET", "jobs", 2):
                    return pb.Job.FromString(rec["pb"].SerializeToString())
                if route == ("GET", "jobs", 3) and parts[2] == "result":
                    if rec["result"] is None:
                        raise _Error(404, "no result yet")
                    return rec["result"]
        raise _Error(404, f"no route {method} {'/'.join(parts)}")

    def _files(self, method, parts, body, h):
        kind, oid = parts[0], parts[1]
        if (method, kind) == ("PUT", "model"):
            self._get(self.models, oid)["zip"] = body
            return b""
        if (method, kind) == ("POST", "dataset"):
            dec = MultipartDecoder(body, h.headers["Content-Type"])
            part = next(p for p in dec.parts if b'name="file"' in p.headers[b"Content-Disposition"])
            self._get(self.datasets, oid)["h5"] = part.content
            return b""
        if (method, kind) == ("GET", "dataset"):
            return self._get(self.datasets, oid)["h5"]
        raise _Error(404, "no such file route")

    @staticmethod
    def _get(table, oid):
        if oid not in table:
            raise _Error(404, f"{oid} not found")
        return table[oid]

    @staticmethod
    def _stamp(d):
        d.creation_time.GetCurrentTime()
        d.expiration_time.FromSeconds(int(time.time()) + 30 * 86400)

    def _unpack(self, rec, model_id):
        out = self.dir / "models" / model_id
        with zipfile.ZipFile(io.BytesIO(rec["zip"])) as z:
            z.extractall(out)
        found = sorted(out.rglob("*.onnx"))
        if len(found) != 1:
            raise _Error(400, f"the uploaded model holds {len(found)} .onnx files")
        rec["onnx"] = found[0]
        rec["pb"].file_upload_complete = True

    # -- jobs -----------------------------------------------------------------------------------------------------------
    def _create_job(self, body):
        job = pb.Job()
        job.ParseFromString(body)
        jid = self._new_id("j")
        job.hub_version = "standin"
        kind = job.WhichOneof("job")
        if kind == "compile_job":
            c = job.compile_job
            c.compile_job_id, c.job_state = jid, pb.JOB_STATE_CREATED
            name = c.devices.devices[0].name if c.devices.devices else DEVICES[0][0]
            c.device.CopyFrom(next(pb.Device(name=n, os=o, attributes=a) for n, o, a in DEVICES if n == name))
            c.creation_time.GetCurrentTime()
            # the client asks for seed_target_model=true: the target model exists (empty) from the job's creation
            opts = c.options.split()
            runtime = opts[opts.index("--target_runtime") + 1] if "--target_runtime" in opts else "qnn_context_binary"
            if runtime not in RUNTIME_MODEL_TYPE:
                raise _Error(400, f"--target_runtime {runtime} is not one the stand-in compiles for")
            target = pb.Model(model_id=self._new_id("m"), name=f"{c.name} target",
                              model_type=RUNTIME_MODEL_TYPE[runtime], producer_id=jid)
            target.creation_time.GetCurrentTime()
            self.models[target.model_id] = {"pb": target, "source": c.model.model_id}
            c.target_model.CopyFrom(target)
        elif kind == "inference_job":
            i = job.inference_job
            i.inference_job_id, i.job_state = jid, pb.JOB_STATE_CREATED
            i.creation_time.GetCurrentTime()
        else:
            raise _Error(400, f"the stand-in runs compile and inference jobs, not {kind}")
        rec = {"pb": job, "result": None}
        with self.lock:
            self.jobs[jid] = rec
        threading.Thread(target=self._run_job, args=(rec,), daemon=True).start()
        return pb.CreateUpdateResponse(id=jid)

    def _set_state(self, rec, state, reason=""):
        with self.lock:
            j = getattr(rec["pb"], rec["pb"].WhichOneof("job"))
            j.job_state = state
            if reason:
                j.failure_reason = reason

    def _run_job(self, rec):
        try:
            if rec["pb"].WhichOneof("job") == "compile_job":
                self._compile(rec)
            else:
                self._infer(rec)
        except Exception as e:
            self._set_state(rec, pb.JOB_STATE_FAILED, f"{type(e).__name__}: {e}")

    def _source(self, model_id: str) -> Path:
        m = self._get(self.models, model_id)
        src = m.get("source")
        return self._get(self.models, src)["onnx"] if src else m["onnx"]

    def _compile(self, rec):
        c = rec["pb"].compile_job
        time.sleep(self.step_seconds)
        self._set_state(rec, pb.JOB_STATE_OPTIMIZING_MODEL)
        src = self._source(c.model.model_id)
        cpu_session(src, threads=1)  # a graph ORT refuses fails the compile job
        time.sleep(self.step_seconds)
        with self.lock:
            self.models[c.target_model.model_id]["pb"].file_upload_complete = True
            c.target_model.file_upload_complete = True
            rec["result"] = pb.JobResult(compile_job_result=pb.CompileJobResult(compile_job_id=c.compile_job_id))
            c.job_state = pb.JOB_STATE_DONE

    def _infer(self, rec):
        i = rec["pb"].inference_job
        time.sleep(self.step_seconds)
        self._set_state(rec, pb.JOB_STATE_PROVISIONING_DEVICE)
        sess = cpu_session(self._source(i.model.model_id), threads=1)
        self._set_state(rec, pb.JOB_STATE_MEASURING_PERFORMANCE if i.is_profiling_on else pb.JOB_STATE_RUNNING_INFERENCE)
        names = [o.name for o in sess.get_outputs()]
        if i.dataset.dataset_id:
            with h5py.File(io.BytesIO(self._get(self.datasets, i.dataset.dataset_id)["h5"]), "r") as f:
                entries = h5_to_dataset_entries(f)
            n = len(next(iter(entries.values())))
            samples = [{k: v[s] for k, v in entries.items()} for s in range(n)]
        else:
            rs = np.random.RandomState(0)
            samples = [{x.name: rs.standard_normal(x.shape).astype(np.float32) for x in sess.get_inputs()}] * 5
        outs, times = {n: [] for n in names}, []
        rs = np.random.RandomState(1)
        for feed in samples:
            t = time.perf_counter()
            got = sess.run(names, feed)
            times.append(int((time.perf_counter() - t) * 1e6))
            for n, a in zip(names, got):
                if self.perturb:
                    a = (a + self.perturb * (float(np.std(a)) or 1.0) * rs.standard_normal(a.shape)).astype(a.dtype)
                outs[n].append(a)
        result = pb.InferenceJobResult(inference_job_id=i.inference_job_id)
        if i.is_profiling_on:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            d = result.detail
            d.major_version, d.minor_version = 1, 2
            d.execution_time, d.after_execution_peak_memory = int(np.median(times)), peak
            d.cold_load_time = d.warm_load_time = int(max(times))
            d.all_execution_times.extend(times)
            d.layer_details.add(name=STANDIN_MARK, layer_type_name="standin", compute_unit=pb.COMPUTE_UNIT_CPU)
        if i.dataset.dataset_id:
            buf = io.BytesIO()
            with h5py.File(buf, "w") as f:
                dataset_entries_to_h5(outs, f)
            ds = pb.Dataset(dataset_id=self._new_id("d"), name="outputs", file_upload_complete=True)
            self._stamp(ds)
            self.datasets[ds.dataset_id] = {"pb": ds, "h5": buf.getvalue()}
            result.output_dataset_id = ds.dataset_id
        time.sleep(self.step_seconds)
        with self.lock:
            rec["result"] = pb.JobResult(inference_job_result=result)
            i.job_state = pb.JOB_STATE_DONE
