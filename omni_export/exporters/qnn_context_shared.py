"""Target ``qnn_context_shared``: a component and its weight-sharing peer (the AR-N prefill and the AR-1 decode step)
compiled into one QNN HTP context binary per part, in which both programs use one copy of the weights.

onnxruntime-qnn's EPContext weight sharing: every session of the group sets ``ep.share_ep_contexts``, the last one
also ``ep.stop_share_ep_contexts``; only that one writes the ``.bin`` and every ``*_ctx.onnx`` points at it. The
programs come from the same QDQ graphs the ``qnn_context`` target compiles one by one; QNN stores a weight once
where both graphs hold the same bytes, and keeps both copies where they differ (scales searched on each program's
calibration data): docs/design.md gives the measured sizes.
Parts are grouped by name (``part0`` of the prefill with ``part0`` of the decode step): each binary stays under the
part limit.

The x86 HTP simulator can write such a binary but cannot load it (measured: the process dies with a segmentation
fault; onnxruntime-qnn's own tests skip loading shared contexts on x86), and neither can Genie there (libGenie of
QNN 2.51 dies in ``GenieDialog_create``, ``tests/runtimes/test_genie_dialog.py``), so the artifact is ``unverified`` here.
The same programs compiled unshared, from the same QDQ graphs, are executed and gated by ``qnn_context``.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import RecipeError, UnsupportedError
from ..runtimes import RuntimeUnavailable
from ..runtimes.ort import htp_session
from .base import Built, Execution, ExportRequest, Target
from .qnn_context import TARGET as QNN_CONTEXT

UNAVAILABLE = ("the x86 QNN HTP simulator cannot load a weight-shared context binary (it crashes; onnxruntime-qnn "
               "skips this on x86), nor can Genie there (libGenie of QNN 2.51 dies with SIGSEGV in GenieDialog_create "
               "on a two-graph shared binary: tests/runtimes/test_genie_dialog.py); each program compiled unshared from the "
               "same QDQ graph is gated by qnn_context")


def graph_names(built: Built) -> list[str]:
    return [k for k in built.files if "." not in k]  # "<graph>" entries; "<graph>.weights" etc. are companions


class QnnContextShared(Target):
    name, format = "qnn_context_shared", "qnn-context-binary"
    schemes = ("fp16", "w8a16")
    device_specific = True

    def dependencies(self, scheme: str):
        return QNN_CONTEXT.dependencies(scheme)

    def peer_dependencies(self, component, scheme: str) -> list[tuple[str, str, str]]:
        """(peer component, target, scheme) builds this one compiles together with its own."""
        peer = component.weight_sharing_peer
        if not peer:
            raise RecipeError(f"target {self.name}: component {component.name} names no weight-sharing peer")
        return [(peer, t, s) for t, s in self.dependencies(scheme)]

    def export(self, req: ExportRequest, out: Path) -> Built:
        comp, fp16 = req.component, req.scheme.half
        (dep_t, dep_s), = self.dependencies(req.scheme.name)
        (peer, _, _), = self.peer_dependencies(comp, req.scheme.name)
        if req.peer is None:
            raise RecipeError(f"target {self.name}: no peer builds available")
        own, other = req.source(dep_t, dep_s), req.peer(peer, dep_t, dep_s)
        if graph_names(own) != graph_names(other):
            raise UnsupportedError(f"{comp.name} graphs {graph_names(own)} and {peer} graphs {graph_names(other)} "
                                   "differ: weight sharing pairs parts by name (give both the same parts)")
        files, sizes = {}, {}
        for g in graph_names(own):
            group = [(f"{peer}.{g}", other.path(g)), (g, own.path(g))]
            # one QNN graph per program in the shared context, named from its source's path: relative to the sources'
            # common folder the paths differ (each source is ``model.onnx`` in its own step directory)
            root = Path(os.path.commonpath([src.resolve().parent for _, src in group]))
            for i, (name, src) in enumerate(group):
                ctx = out / f"{name}_ctx.onnx"
                config = {"ep.share_ep_contexts": "1"} | ({"ep.stop_share_ep_contexts": "1"} if i == len(group) - 1 else {})
                try:
                    htp_session(src, req.device, fp16, context_out=ctx, config=config, root=root)
                except RuntimeUnavailable as e:
                    raise UnsupportedError(f"cannot compile a QNN context binary here: {e}") from None
                files[name] = ctx.name
            (bin_file,) = [p for p in out.glob("*.bin") if p.name not in files.values()]
            files[f"{g}.context_binary"] = bin_file.name
            sizes[g] = bin_file.stat().st_size
        info = {"compiled_from": f"{dep_t}:{dep_s} of {comp.name} and {peer}", "shared_with": peer,
                "htp_precision": "fp16" if fp16 else "quantized (QDQ)", "soc_model": req.device.soc_model,
                "htp_arch": req.device.htp_arch, "embed_mode": 0, "weight_sharing": "ep.share_ep_contexts",
                "context_binary_bytes": sizes}
        return Built(self.name, req.scheme.name, out, files, info)

    def execution(self, built, component, device) -> Execution:
        return Execution(None, unavailable=UNAVAILABLE)


TARGET = QnnContextShared()
