"""Target ``qdq_onnx``: a QDQ ONNX graph for the Qualcomm NPU, quantized with onnxruntime's QNN configuration.

Projections are rewritten as 1x1 convs first (per-channel int8 weights apply to Conv, not MatMul). Activation
ranges come from the calibration set captured from the fp32 pipeline; a scheme marked uncalibrated takes them from
random stand-in inputs instead (what a build without calibration data does). The same file runs on ORT CPU (the
parity runtime here) and is what AI Hub compiles; the ``qnn_context`` target compiles it for a named SoC.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import CalibrationError
from ..lowering.onnx_export import export_onnx, onnx_files
from ..lowering.onnx_rewrites import matmul_as_conv
from ..lowering.parallel import PartPool, job_estimate
from ..quantize.calib_batch import batch_size, batched_graph
from ..quantize.mixed import search_parts
from ..quantize.part import QdqPart
from ..quantize.policy import load_ranges, shared_encodings, shared_groups, static_plan
from ..quantize.readback import off_plan_int16
from ..schemes import get_scheme
from .base import Built, Execution, ExportRequest, Target, qdq_chain

TARGET_NAME = "qdq_onnx"
RANDOM_SAMPLES = 8
QUANTIZE_PER_BYTE = 2.0  # two full-size parts beside the pipeline summed to 11.8 GiB (docs/design.md): one at a time there


def random_feeds(specs, seed: int = 0):
    rs = np.random.RandomState(seed)
    for _ in range(RANDOM_SAMPLES):
        yield {s.name: rs.standard_normal(s.shape).astype(np.float32) for s in specs}


def qdq_source(comp, graph, scheme, path: Path, fp32_onnx: Path | None = None):
    """Write the fp32 ONNX graph a QDQ build of ``scheme`` quantizes for ``graph`` to ``path``; returns the module it
    computes (what ``Component.qdq_policy`` reads). Projections are 1x1 convs: a component with a torch QDQ form of
    its own (``Component.graph_for("qdq_onnx", ...)``) is exported in that form; any other is the fp32 ONNX export (``fp32_onnx``, the
    ``onnx`` target's file, else exported here) with its MatMuls rewritten as convs in the ONNX graph, so the model
    is not exported twice. Whatever compares against a QDQ graph tensor by tensor reads this same source."""
    own = comp.graph_for(TARGET_NAME, graph, scheme)
    if own is not None:
        export_onnx(own, graph, path, fuse_norms=scheme.fused_norm)
        return own
    if fp32_onnx is None or not scheme.fused_norm:  # the fp32 export's norms are fused: a naive build re-exports
        fp32_onnx = export_onnx(graph.module, graph, path.with_name(path.stem + ".fp32.onnx"),
                                fuse_norms=scheme.fused_norm)
    matmul_as_conv(fp32_onnx, path)
    return graph.module


def batched_source(comp, graph, scheme, path: Path, batch: int) -> Path:
    """``qdq_source`` of ``graph`` at ``batch`` samples per call (``calib_batch``): the same module exported with
    every leading dimension ``batch``, through the same rewrites, for the calibration pass only."""
    g = batched_graph(graph, batch)
    own = comp.graph_for(TARGET_NAME, graph, scheme)
    if own is not None:
        return export_onnx(own, g, path, fuse_norms=scheme.fused_norm)
    fp32 = export_onnx(graph.module, g, path.with_name(path.stem + ".fp32.onnx"), fuse_norms=scheme.fused_norm)
    matmul_as_conv(fp32, path)
    return path


def _batching(comp, graph, scheme, src: Path, req: ExportRequest):
    """``(B, make)`` for the calibration pass of ``src`` (``calib_batch.batch_size``), or None: one sample a call."""
    if req.calibration is None:
        return None
    weights = sum(p.stat().st_size for p in src.parent.iterdir() if p.is_file())
    b = batch_size(comp, graph, weights, req.calibration.samples)
    if b == 1:
        return None
    return b, lambda: batched_source(comp, graph, scheme, src.parent / "batched" / src.name, b)


def _ranges_memo(req: ExportRequest, graph: str):
    """``(key, build) -> directory``: a calibration pass of ``graph`` on the request's calibration set, as a finished
    step of the store other schemes' builds of the same graph find (``quantize.qdq.memo_ranges``)."""
    if req.memo is None or req.calibration is None:
        return None
    return lambda key, build: req.memo("activation-ranges", {**key, "graph_name": graph,
                                                             "calibration": req.calibration.hash}, build)


class QdqOnnx(Target):
    name, format = TARGET_NAME, "onnx-qdq"
    schemes = ("w8a16", "w8a8", "w4a16_uncalibrated", "w8a16_percentile", "w8a16_entropy", "w8a16_uncalibrated",
               "w4a16", "w8a16_mixed", "w8a16_naive")
    rewrites = ("linear_to_conv",)

    def dependencies(self, scheme: str):
        """The fp32 ONNX build, the graph quantized (``qdq_source``; unless the component has a QDQ form of its own);
        none for a scheme that quantizes the exporter's decomposed RMSNorm (``fused_norm`` false: the naive build),
        whose source is exported again with its norms unfused."""
        return [("onnx", "fp32")] if get_scheme(scheme).fused_norm else []

    def export(self, req: ExportRequest, out: Path) -> Built:
        comp, scheme = req.component, req.scheme
        if scheme.calibrated and req.calibration is None:
            raise CalibrationError(f"scheme {scheme.name} is calibrated but no calibration set was given")
        files, mixed, policies, shared_record, floats = {}, {}, {}, {}, {}
        staged = comp.staged_feeds(req.calibration) if scheme.calibrated else None
        deps = self.dependencies(scheme.name)
        fp32 = req.source(*deps[0]) if req.source is not None and deps else None
        graphs = comp.graphs()
        job = job_estimate(fp32, graphs, QUANTIZE_PER_BYTE) if fp32 is not None else None
        # ranges first, then quantization, when the policy decides from them or parts must share encodings
        minmax = scheme.calibrated and scheme.range_method == "minmax"
        built, pending = [], []
        with PartPool(len(graphs) if not scheme.mixed else 1, job) as pool:
            for g in comp.each_graph():  # one graph at a time: only one graph's weights are in flight
                work = out / f".fp32-{g.name}"
                work.mkdir()
                src = work / "rewritten.onnx"
                module = qdq_source(comp, g, scheme, src, fp32.path(g.name) if fp32 is not None else None)
                comp.release_weights()  # the graph is on disk; calibration and quantization read the ONNX file
                policy = comp.qdq_policy(g.name, module, scheme)  # what this component keeps wider or at int16, and why
                feeds = staged.feeds(g) if staged is not None else random_feeds(g.inputs)
                part = QdqPart(g, src, out / f"{g.name}.onnx", policy, static_plan(src, policy, scheme.activations))
                built.append(part)
                memo = _ranges_memo(req, g.name) if minmax else None
                batched = _batching(comp, g, scheme, src, req) if minmax else None
                # the pass's fp32 outputs that later graphs read: their calibration inputs, without an eager rerun
                read = staged.read_later(g) if staged is not None else []
                later = (read, []) if read else None
                if minmax and (len(graphs) > 1 or part.needs_ranges() or scheme.mixed):
                    part.calibrate(feeds, scheme, memo, batched, later)
                    pending.append(part)
                elif memo is not None:  # the ranges from another build's pass over this graph, or a pass here
                    part.calibrate(feeds, scheme, memo, batched, later)
                    part.submit(pool, (), scheme, {})
                else:  # calibration and quantization of this part in a worker, while the next is prepared here
                    part.submit(pool, feeds if pool.inline else list(feeds), scheme, {})
                if policy:
                    policies[g.name] = part.record()
                if staged is not None:  # the next graph's calibration inputs: this graph's fp32 outputs
                    staged.advance(g, later[1] if later else None)
            if pending:
                rhs = [g for p in pending for g in p.rhs_io()]
                groups = shared_groups({p.graph.name: ([s.name for s in p.graph.inputs],
                                                       [s.name for s in p.graph.outputs]) for p in pending},
                                       any(p.policy and p.policy.shared_kv for p in pending), rhs)
                shared, shared_record = shared_encodings([load_ranges(p.cache) for p in pending], groups,
                                                         scheme.activations, {t for g in rhs for t in g})
                if scheme.mixed:  # each part's smallest set of int16 weights that clears the bars (``mixed``)
                    mixed = search_parts(pending, shared, scheme, req, fp32)
                else:
                    for p in pending:
                        p.submit(pool, (), scheme, shared)
        floats = {p.graph.name: len(p.plan.float_nodes) for p in built if p.plan.float_nodes}
        for g in graphs:
            files.update(onnx_files(out / f"{g.name}.onnx", g.name))
        ranges = (f"calibration set {req.calibration.hash[:12]}" if scheme.calibrated
                  else f"{RANDOM_SAMPLES} random normal stand-in inputs")
        info = {"opset": 21, "rewrites": list(self.rewrites), "activation_ranges": ranges,
                "quantizer": "onnxruntime.quantization get_qnn_qdq_config", "weight_symmetric": True}
        if mixed:
            info["mixed_precision"] = mixed
        if policies:
            info["component_policy"] = policies
        if shared_record:
            info["shared_encodings"] = {"rule": "one (scale, zero point) from the union of every graph's calibrated "
                                                "range, passed to every graph that has the tensor", "tensors": shared_record}
        rhs = {p.graph.name: p.plan.rhs_int16 for p in built if p.plan.rhs_int16}
        if rhs:
            info["matmul_rhs_int16"] = {"rule": "the second input of a MatMul of two activations, with the Concat "
                                                "inputs making it, int16 symmetric (the QNN EP converts an asymmetric "
                                                "uint16 one to uint8)", "tensors": rhs}
            conv = {p.graph.name: {src: {"for": node, "group_of": member}
                                   for src, (node, member) in sorted(p.plan.rhs_converted.items())}
                    for p in built if p.plan.rhs_converted}
            if conv:  # a new row moved from a projection: converted where it enters its move (policy.moved_new_rows)
                info["matmul_rhs_int16"]["converted"] = conv
            # read back from the files: a tensor the quantizer encoded otherwise (a Reshape output takes its input's)
            off = {name: o for name, gs in rhs.items() if (o := off_plan_int16(out / f"{name}.onnx", gs))}
            if off:
                info["matmul_rhs_int16"]["written_otherwise"] = off
        if floats:
            info["float_nodes"] = floats  # left float in the QDQ graph: the HTP runs them in fp16
        return Built(self.name, scheme.name, out, files, info)

    def execution(self, built, component, device) -> Execution:
        """A chain of parts runs one part's session at a time where the trace allows it (``Execution.parts``), each
        with its weights dequantized once (``ort_cpu(alone=True)``); the whole chain, opened only for a free run past
        the recorded calls, dequantizes a large part's weights on every call (the same outputs bit for bit)."""
        run, parts = qdq_chain(built, component)
        return Execution("onnxruntime-cpu (QDQ)", run, parts=parts)


TARGET = QdqOnnx()
