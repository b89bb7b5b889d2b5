"""Every call to the ``qai-hub`` client goes through ``HubSession``: configured only from the client's own config
(client.ini / QAIHUB_CLIENT_INI), the token redacted from any message that leaves it, the service's reachability
checked with a bounded timeout before any work, device names checked against the service's device list before any
upload, and job polling with exponential backoff up to a deadline (``tenacity``).
"""
from __future__ import annotations

import contextlib
import os
import threading
import time

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from tenacity import RetryError, Retrying, retry_if_result, stop_after_delay, wait_exponential

from ..errors import HubError, MissingDependency, OmniError

CONNECT_SECONDS = 20.0  # how long the first contact with the service may take before it counts as unreachable


def bounded(fn, seconds: float, what: str):
    """``fn()`` in a daemon thread; a HubError naming ``what`` when it has not returned within ``seconds`` (the
    client's own retries can otherwise keep a command silent for minutes)."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise HubError(f"{what}: no answer from AI Hub within {seconds:.0f} s (is the service reachable from here? "
                       "check the network, a proxy, or api_url in the client configuration)")
    if "error" in box:
        raise box["error"]
    return box.get("value")


class HubSession:
    def __init__(self, connect_seconds: float = CONNECT_SECONDS):
        try:
            import qai_hub
            from qai_hub import api_utils
        except ImportError:
            raise MissingDependency("qai-hub is not installed (pip install qai-hub)") from None
        self.hub, self.connect_seconds = qai_hub, connect_seconds
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
        self.api_url = cfg.api_url
        cfg.verbose = False  # progress is shown by omni-export; the client would print its own bars to stdout
        self._devices = None

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

    def call(self, what: str, fn, seconds: float | None = None):
        """One client call, bounded in time (default: the connect timeout) and with its errors made one line."""
        with self.calling(what):
            return bounded(fn, seconds or self.connect_seconds, what)

    def devices(self) -> list:
        """The service's device list (one bounded call, kept): also the first contact, so an unreachable service
        fails here, before anything is built or uploaded."""
        if self._devices is None:
            self._devices = self.call(f"listing AI Hub devices at {self.api_url}", self.client.get_devices)
        return self._devices

    def check_device(self, name: str):
        """The service's device of that exact name, or a one-line error listing what it offers."""
        devices = self.devices()
        for d in devices:
            if d.name == name:
                return d
        names = sorted({d.name for d in devices})
        raise HubError(f"device {name!r} is not in AI Hub's device list ({len(names)} devices, e.g. "
                       f"{', '.join(names[:4])}); `omni-export hub devices` lists them. Nothing was uploaded")

    def wait(self, jobs: dict[str, object], console: Console, poll: float, timeout: float) -> dict:
        """Poll until every job finished, with a live status line per job: the interval starts at ``poll`` seconds
        and doubles up to 60 s (a long compile is not polled every few seconds for hours); gives up after
        ``timeout`` seconds (the jobs keep running on the service; a rerun resumes waiting)."""
        done: dict = {}
        cols = (SpinnerColumn(), TextColumn("  {task.description}"), TextColumn("[cyan]{task.fields[state]}"),
                TimeElapsedColumn())
        with Progress(*cols, console=console, transient=True) as prog:
            tasks = {k: prog.add_task(k, total=None, state="submitted") for k in jobs}

            def pending() -> bool:
                for k, job in jobs.items():
                    if k not in done:
                        st = self.call(f"status of AI Hub job {job.job_id}", job.get_status)
                        prog.update(tasks[k], state=st.code)
                        if st.finished:
                            done[k] = st
                return len(done) < len(jobs)

            retrying = Retrying(retry=retry_if_result(bool), stop=stop_after_delay(timeout), sleep=time.sleep,
                                wait=wait_exponential(multiplier=poll, min=poll, max=max(poll, 60.0)))
            try:
                retrying(pending)
            except RetryError:
                waiting = ", ".join(f"{k} {jobs[k].job_id}" for k in jobs if k not in done)
                raise HubError(f"AI Hub jobs still running after {timeout:.0f} s ({waiting}); "
                               "rerun the same command to resume waiting") from None
        return done
