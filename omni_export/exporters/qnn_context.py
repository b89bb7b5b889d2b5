"""Target ``qnn_context``: an offline QNN HTP context binary for a named SoC (ORT EPContext: ``model_ctx.onnx`` +
``model_ctx_qnn.bin``), compiled from the QDQ graph (quantized schemes) or the fp32 graph with HTP fp16 precision.

Parity executes that context binary on the QNN HTP simulator, with the QDQ source on ORT CPU beside it for the
three-way comparison (fp32 vs CPU-QDQ, CPU-QDQ vs HTP, fp32 vs HTP)."""
from __future__ import annotations

import functools
from pathlib import Path

from ..errors import UnsupportedError
from ..lowering.parallel import PartPool, job_estimate
from ..runtimes import RuntimeUnavailable
from ..runtimes.ort import htp_session, qnn_htp, require_qnn
from .base import Built, Execution, ExportRequest, Target, lazy_chain, qdq_chain


COMPILE_PER_BYTE = 2.0  # full size (0.41-0.46 GB int8 a part): two compiles beside the pipeline summed to 5.4-7.8 GiB


def compile_part(src: Path, device, fp16: bool, ctx: Path) -> None:
    """One part's QNN context binary (``ctx`` and its ``.bin``), compiled from ``src``: ``PartPool``'s unit of work."""
    try:
        htp_session(Path(src), device, fp16=fp16, context_out=Path(ctx))
    except RuntimeUnavailable as e:
        raise UnsupportedError(f"cannot compile a QNN context binary here: {e}") from None


class QnnContext(Target):
    name, format = "qnn_context", "qnn-context-binary"
    schemes = ("fp16", "w8a16", "w8a8", "w4a16_uncalibrated", "w8a16_percentile", "w8a16_entropy", "w4a16",
               "w8a16_naive")
    device_specific = True

    def dependencies(self, scheme: str):
        return [("onnx", "fp32")] if scheme == "fp16" else [("qdq_onnx", scheme)]

    def export(self, req: ExportRequest, out: Path) -> Built:
        (dep_t, dep_s), = self.dependencies(req.scheme.name)
        src = req.source(dep_t, dep_s)
        fp16 = req.scheme.half or bool(src.info.get("float_nodes"))  # fp16 islands of the QDQ graph
        files, graphs = {}, req.component.graphs()
        # the compiler is single-threaded: parts side by side, each in a fresh process (reproducible binaries: parallel.py)
        with PartPool(len(graphs), job_estimate(src, graphs, COMPILE_PER_BYTE), isolated=True) as pool:
            for g in graphs:
                pool.submit(compile_part, src.path(g.name), req.device, fp16, out / f"{g.name}_ctx.onnx")
        for g in graphs:
            files[g.name] = f"{g.name}_ctx.onnx"
            for f in sorted(out.glob(f"{g.name}_ctx*.bin")):
                files[f"{g.name}.context_binary"] = f.name
        precision = "fp16" if req.scheme.half else "quantized (QDQ)" + (
            ", float nodes in fp16 (enable_htp_fp16_precision)" if fp16 else "")
        info = {"compiled_from": f"{dep_t}:{dep_s}", "htp_precision": precision,
                "soc_model": req.device.soc_model, "htp_arch": req.device.htp_arch, "embed_mode": 0,
                "graphs": [g.name for g in req.component.graphs()]}
        return Built(self.name, req.scheme.name, out, files, info)

    def execution(self, built, component, device) -> Execution:
        """Sessions are made at their first call, so a chain of parts can run one part at a time (``Execution.parts``:
        at full size the HTP simulator's four sessions and the CPU-QDQ companion's four held 7.3 GiB together)."""
        fp16 = built.scheme == "fp16" or "fp16" in built.info.get("htp_precision", "")
        try:
            require_qnn()
        except RuntimeUnavailable as e:
            return Execution(None, unavailable=str(e))
        outs = {g.name: [s.name for s in g.outputs] for g in component.graphs()}
        parts = {n: functools.partial(qnn_htp, built.path(n), o, device, fp16=fp16) for n, o in outs.items()}
        companions, companion_parts = {}, {}
        if built.scheme != "fp16":
            name = "onnxruntime-cpu (QDQ)"
            companions[name], cparts = qdq_chain(built.deps[0], component)
            companion_parts = {name: cparts} if cparts else {}
        run, parts = lazy_chain(component, parts)
        return Execution(f"qnn-htp-simulator ({device.chipset})", run, companions=companions, bounded=True, parts=parts,
                         companion_parts=companion_parts)


TARGET = QnnContext()
