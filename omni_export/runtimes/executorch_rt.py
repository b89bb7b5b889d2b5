"""The ExecuTorch runtime (``executorch.runtime``): loads the ``.pte`` file that ships and executes its ``forward``.

Only backends compiled into this wheel can run (XNNPACK, portable kernels); a program delegated to a backend the
runtime lacks (CoreML on Linux) raises ``RuntimeUnavailable``."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import MissingDependency
from . import RuntimeUnavailable


def _runtime():
    try:
        from executorch.runtime import Runtime
    except ImportError:
        raise MissingDependency("executorch is not installed (pip install executorch)") from None
    _pin_threads()
    return Runtime.get()


def _pin_threads() -> None:
    """XNNPACK's threadpool takes every core unless told: it follows ``OMNI_EXPORT_THREADS`` where that is set, as
    ORT's CPU sessions do (two test workers on two cores then take one thread each instead of two spinning)."""
    want = int(os.environ.get("OMNI_EXPORT_THREADS") or 0)
    if want <= 0:
        return
    from executorch.extension.pybindings.portable_lib import _threadpool_get_thread_count, _unsafe_reset_threadpool

    if int(_threadpool_get_thread_count()) != want:
        _unsafe_reset_threadpool(want)  # between programs only: nothing of this process runs on the pool now


def registered_backends() -> list[str]:
    return list(_runtime().backend_registry.registered_backend_names)


def executorch_runner(path: Path, input_names, needs_backends: tuple[str, ...] = ()):
    """A Runner over the program's ``forward``: named numpy inputs (in ``input_names`` order) -> numpy outputs."""
    import torch

    rt = _runtime()
    missing = [b for b in needs_backends if not rt.backend_registry.is_available(b)]
    if missing:
        raise RuntimeUnavailable(f"this ExecuTorch runtime has no {', '.join(missing)} backend "
                                 f"(registered: {', '.join(registered_backends())})")
    try:
        method = rt.load_program(Path(path)).load_method("forward")
    except Exception as e:
        raise RuntimeUnavailable(f"ExecuTorch cannot load {Path(path).name}: {str(e).splitlines()[0][:300]}") from None
    names = list(input_names)

    def run(feed):
        outs = method.execute([torch.from_numpy(np.ascontiguousarray(feed[n], dtype=np.float32)) for n in names])
        return [o.numpy() for o in outs]

    return run
