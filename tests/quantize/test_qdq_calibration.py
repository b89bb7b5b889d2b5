"""The streaming min-max calibrator (one sample at a time, ranges merged) gives exactly onnxruntime's one-shot
ranges and the same QDQ graph, without holding every sample's intermediate outputs."""
import dataclasses

import numpy as np
import onnx
import pytest

from omni_export.families import load_prompt_set
from omni_export.components.decoder_lm import DecodeStepComponent
from omni_export.quantize import minmax_graph, qdq as qdq_quantize
from omni_export.lowering.onnx_export import export_onnx
from omni_export.blocks.graph_forms import linear_to_conv
from omni_export.schemes import get_scheme


def test_streaming_minmax_equals_onnxruntime_one_shot(tiny_spark, tmp_path, monkeypatch):
    from onnxruntime.quantization.calibrate import load_tensors_data
    comp = DecodeStepComponent(tiny_spark, 64)
    feeds = list(comp.calibration_feeds(load_prompt_set("spark_calibration"), {"max_prompt_tokens": 16, "new_tokens": 4}))[:12]
    (g,) = comp.graphs()
    src = export_onnx(linear_to_conv(g.module), g, tmp_path / "m.onnx")
    scheme = get_scheme("w8a16")
    qdq_quantize.quantize_qdq(src, tmp_path / "stream.onnx", iter(feeds), scheme, ranges_cache=tmp_path / "s.json")
    # onnxruntime's own calibration pass: a range-method name our streaming path does not claim, mapped to MinMax
    monkeypatch.setitem(qdq_quantize.RANGE, "minmax_ort", "MinMax")
    qdq_quantize.quantize_qdq(src, tmp_path / "ort.onnx", iter(feeds), dataclasses.replace(scheme, range_method="minmax_ort"),
                          ranges_cache=tmp_path / "o.json")
    # the calibration graph's grouping (minmax_graph) does not change a range: every tensor reduced alone, all of
    # one shape in one group, groups of at most 4 KiB, and the defaults (large tensors alone, small ones grouped)
    for i, (alone, group, open_) in enumerate(((0, 1, 1), (1 << 40, 1 << 40, 1 << 40), (1 << 40, 4096, 1 << 40))):
        with monkeypatch.context() as mp:
            for k, v in (("ALONE_BYTES", alone), ("GROUP_BYTES", group), ("OPEN_BYTES", open_)):
                mp.setattr(minmax_graph, k, v)
            qdq_quantize.calibrate_part(src, iter(feeds), scheme, tmp_path / f"g{i}.json")
    a, b = (dict(load_tensors_data(tmp_path / f).items()) for f in ("s.json", "o.json"))
    assert set(a) == set(b) and len(a) > 100
    for f in ("s.json", "g0.json", "g1.json", "g2.json"):
        a = dict(load_tensors_data(tmp_path / f).items())
        assert set(a) == set(b)
        for k in a:
            assert np.array_equal(np.asarray(a[k].range_value), np.asarray(b[k].range_value)), (f, k)
    ia, ib = ({i.name: onnx.numpy_helper.to_array(i) for i in onnx.load(str(tmp_path / f)).graph.initializer}
              for f in ("stream.onnx", "ort.onnx"))
    assert set(ia) == set(ib) and all(np.array_equal(ia[k], ib[k]) for k in ia)


def test_histogram_calibration_in_chunks_is_onnxruntimes_own(tiny_spark, tmp_path, monkeypatch):
    """``histogram_pass``: percentile ranges from onnxruntime's calibrator fed in chunks. All samples in one chunk:
    the ranges and QDQ graph of ``quantize_static``'s own pass; chunks of 3 samples: 4 calls for 10 samples (never an
    empty one), ranges within a few of the first chunk's bins of the one-shot ones."""
    from onnxruntime.quantization import CalibrationMethod
    from onnxruntime.quantization.calibrate import load_tensors_data

    from omni_export.quantize import histogram_pass
    comp = DecodeStepComponent(tiny_spark, 64)
    feeds = list(comp.calibration_feeds(load_prompt_set("spark_calibration"), {"max_prompt_tokens": 16, "new_tokens": 4}))[:10]
    (g,) = comp.graphs()
    src = export_onnx(linear_to_conv(g.module), g, tmp_path / "m.onnx")
    scheme = get_scheme("w8a16_percentile")
    calls = []
    real = histogram_pass.calibrate_histogram
    monkeypatch.setattr(qdq_quantize, "calibrate_histogram", lambda *a: calls.append(real(*a)))
    qdq_quantize.quantize_qdq(src, tmp_path / "ours.onnx", iter(feeds), scheme, ranges_cache=tmp_path / "ours.json")
    monkeypatch.setitem(qdq_quantize.RANGE, "percentile_ort", "Percentile")  # a name the chunked path does not claim
    qdq_quantize.quantize_qdq(src, tmp_path / "ort.onnx", iter(feeds),
                              dataclasses.replace(scheme, range_method="percentile_ort"), ranges_cache=tmp_path / "ort.json")
    assert calls == [1] and histogram_pass.samples_per_chunk(src, None) >= 10
    ours, ort = (dict(load_tensors_data(tmp_path / f).items()) for f in ("ours.json", "ort.json"))
    assert set(ours) == set(ort) and len(ours) > 100
    assert all(np.array_equal(np.asarray(ours[k].range_value), np.asarray(ort[k].range_value)) for k in ours)
    ia, ib = ({i.name: onnx.numpy_helper.to_array(i) for i in onnx.load(str(tmp_path / f)).graph.initializer}
              for f in ("ours.onnx", "ort.onnx"))
    assert set(ia) == set(ib) and all(np.array_equal(ia[k], ib[k]) for k in ia)
    monkeypatch.setattr(histogram_pass, "samples_per_chunk", lambda *a: 3)
    n = histogram_pass.calibrate_histogram(src, iter_reader(feeds), tmp_path / "chunks.json", CalibrationMethod.Percentile,
                                           None, ["CPUExecutionProvider"], {})
    assert n == 4
    chunked = dict(load_tensors_data(tmp_path / "chunks.json").items())
    assert set(chunked) == set(ours)
    for k, r in chunked.items():
        a, b = np.asarray(r.range_value, np.float64), np.asarray(ours[k].range_value, np.float64)
        assert np.abs(a - b).max() <= 4 / 2048 * max(np.abs(b).max(), 1e-6), k  # measured: 1 bin (2,048 bins)
    n = histogram_pass.calibrate_histogram(src, iter_reader(feeds[:9]), tmp_path / "c9.json",
                                           CalibrationMethod.Percentile, None, ["CPUExecutionProvider"], {})
    assert n == 3


def iter_reader(feeds):
    from omni_export.quantize.minmax_pass import _Reader
    return _Reader(feeds)


def test_empty_calibration_stream_is_a_one_line_error(tiny_spark, tmp_path):
    import pytest
    from omni_export.errors import CalibrationError
    comp = DecodeStepComponent(tiny_spark, 64)
    (g,) = comp.graphs()
    src = export_onnx(linear_to_conv(g.module), g, tmp_path / "m.onnx")
    with pytest.raises(CalibrationError, match="empty"):
        qdq_quantize.quantize_qdq(src, tmp_path / "q.onnx", iter(()), get_scheme("w8a16"))


def test_indexed_rewiring_builds_the_same_bytes_as_onnxruntimes_own(tiny_spark, tmp_path, monkeypatch):
    """The quantizer's rewiring through an index of consumers (``quantizer_rewiring.indexed_rewiring``) gives the
    byte-identical QDQ graph and weights that onnxruntime's own node-by-node rewiring gives: plain, and with two
    activations at uint8 in a uint16 graph (their consumers rewired to converted encodings through
    ``replace_input_of_nodes``) and the int16 MatMul inputs."""
    import contextlib

    from onnxruntime.quantization import QuantType

    from omni_export.quantize.policy import rhs_overrides, static_plan

    comp = DecodeStepComponent(tiny_spark, 64)
    feeds = list(comp.calibration_feeds(load_prompt_set("spark_calibration"), {"max_prompt_tokens": 16, "new_tokens": 4}))[:8]
    (g,) = comp.graphs()
    src = export_onnx(linear_to_conv(g.module), g, tmp_path / "m.onnx")
    scheme = get_scheme("w8a16")
    fixed = rhs_overrides(static_plan(src, None, "uint16").rhs_int16, {}, None, "uint16")
    nodes = onnx.load(str(src), load_external_data=False).graph.node
    narrow = [next(n.output[0] for n in nodes if n.op_type == op) for op in ("Softmax", "Mul")]
    assert fixed and len(narrow) == 2  # the attention MatMuls' second inputs; a softmax and a product
    mixed = {t: [{"quant_type": QuantType.QUInt8}] for t in narrow}
    for kind in ("fast", "ort"):
        if kind == "ort":
            monkeypatch.setattr(qdq_quantize, "indexed_rewiring", contextlib.nullcontext)
        for case, (ovr, rhs) in (("plain", (None, None)), ("mixed", (mixed, fixed))):
            (tmp_path / kind / case).mkdir(parents=True)
            qdq_quantize.quantize_qdq(src, tmp_path / kind / case / "q.onnx", iter(feeds), scheme, init_overrides=ovr,
                                      ranges_cache=tmp_path / "r.json", fixed=rhs)
    for case in ("plain", "mixed"):
        fast, ort = (sorted((tmp_path / d / case).iterdir()) for d in ("fast", "ort"))
        assert [p.name for p in fast] == [p.name for p in ort] and len(fast) >= 2  # the graph and its weight file
        for a, b in zip(fast, ort):
            assert a.read_bytes() == b.read_bytes(), (case, a.name)
    plain, mixed = (onnx.load(str(tmp_path / "fast" / c / "q.onnx"), load_external_data=False).graph
                    for c in ("plain", "mixed"))
    assert len(mixed.node) > len(plain.node)  # the conversions' own Q/DQ nodes


@pytest.mark.slow  # builds the shared spark_w8a16 store (HTP simulator and Genie parity) and two spark_w8a8 runs
def test_two_schemes_quantizing_one_graph_share_one_calibration_pass(tmp_path, shared_store):
    """w8a16 then w8a8 of the same decode step on one store: the w8a8 build reads the ranges the w8a16 build's pass
    (which also gathered the scale search's Gram matrices) left as a finished step, makes no pass of its own, and its
    QDQ graph is byte-identical to a w8a8 build that calibrated alone on a fresh store."""
    from shared_stores import copy_store

    from omni_export.commands.cli import main

    shared = copy_store(shared_store("spark_w8a16").path, tmp_path / "shared")  # the w8a16 recipe's store
    alone = tmp_path / "alone"
    passes = sorted(p.name for p in (shared / "cache" / "activation-ranges").iterdir())
    assert len(passes) == 2  # decode step and prefill, each one pass
    main(["recipe", "spark_w8a8", "--store", str(shared)])  # blocked (int8 activations): what it builds is the point
    assert sorted(p.name for p in (shared / "cache" / "activation-ranges").iterdir()) == passes
    main(["recipe", "spark_w8a8", "--store", str(alone)])
    assert len(list((alone / "cache" / "activation-ranges").iterdir())) == 1
    art = ("blocked", "spark_w8a8", "decode_step.w8a8.qdq_onnx")
    for name in ("model.onnx", "model.onnx.data"):
        assert shared.joinpath(*art, name).read_bytes() == alone.joinpath(*art, name).read_bytes(), name


def test_batched_calibration_pass_gives_the_samples_ranges_and_grams(tiny_spark, tmp_path):
    """``calib_batch``: the pass over the decode step exported at batch 4 (10 samples: two batched calls, then two
    samples on the batch-1 graph) gives every tensor the range and every projection input the Gram matrix of the
    pass one sample a call, up to the rounding of a batched matmul; a copy whose tensors do not hold B times the
    elements, a copy that mixes the rows of a batch, and a copy that cannot be built are refused and the pass runs
    one sample a call, saying why, with the same ranges and Gram matrices."""
    import json

    from omni_export.quantize.calib_batch import batch_size
    from omni_export.quantize.minmax_pass import batch_note
    from omni_export.exporters.qdq_onnx import batched_source, qdq_source
    from omni_export.quantize.scale_search import gram_path, load_grams
    from onnxruntime.quantization.calibrate import load_tensors_data

    comp = DecodeStepComponent(tiny_spark, 64)
    feeds = list(comp.calibration_feeds(load_prompt_set("spark_calibration"), {"max_prompt_tokens": 16, "new_tokens": 4}))[:10]
    (g,) = comp.graphs()
    scheme = get_scheme("w8a16")
    src = tmp_path / "one" / "rewritten.onnx"
    src.parent.mkdir()
    qdq_source(comp, g, scheme, src)
    (tmp_path / "four").mkdir()
    made = []

    def make():
        made.append(batched_source(comp, g, scheme, tmp_path / "four" / "rewritten.onnx", 4))
        return made[-1]

    def mixing():  # the batch-4 copy with the rows of a float input mixed (x + x reversed along the batch)
        import onnx
        from onnx import TensorProto, helper
        m = onnx.load(str(made[0]), load_external_data=False)
        x = next(i.name for i in m.graph.input if i.type.tensor_type.elem_type == TensorProto.FLOAT)
        for n in m.graph.node:
            n.input[:] = [f"{x}.mixed" if t == x else t for t in n.input]
        consts = [helper.make_tensor(f"mix.{k}", TensorProto.INT64, [1], [v])
                  for k, v in (("starts", -1), ("ends", -(2 ** 63)), ("axes", 0), ("steps", -1))]
        m.graph.initializer.extend(consts)
        m.graph.node.insert(0, helper.make_node("Slice", [x] + [c.name for c in consts], [f"{x}.rev"]))
        m.graph.node.insert(1, helper.make_node("Add", [x, f"{x}.rev"], [f"{x}.mixed"]))
        out = made[0].with_name("mixed.onnx")
        onnx.save(m, str(out))
        return out

    def broken():
        raise ValueError("graph decode_step: cache_k (1, 2) has no leading batch dimension of 1\nmore")

    runs = {"one": None, "four": (4, make), "refused": (4, lambda: src),  # the batch-1 graph is no batch-4 copy
            "mixed": (4, mixing), "unbuilt": (4, broken)}
    got = {}
    for name, batched in runs.items():
        cache = tmp_path / f"{name}.json"
        qdq_quantize.calibrate_part(src, iter(feeds), scheme, cache, search=True, batched=batched)
        got[name] = (dict(load_tensors_data(cache).items()), load_grams(gram_path(cache)),
                     json.loads(batch_note(cache).read_text()))
    assert len(made) == 1
    assert got["one"][2] == {"samples_per_call": 1, "samples": 10}
    assert got["four"][2] == {"samples_per_call": 4, "samples": 10}
    assert got["refused"][2]["samples_per_call"] == 1 and "elements" in got["refused"][2]["batch_refused"]
    assert got["mixed"][2]["samples_per_call"] == 1 and "one at a time" in got["mixed"][2]["batch_refused"]
    assert got["unbuilt"][2] == {"samples_per_call": 1, "samples": 10, "batch_refused": "batch-4 copy not built: "
                                 "ValueError: graph decode_step: cache_k (1, 2) has no leading batch dimension of 1"}
    ref_ranges, ref_grams, _ = got["one"]
    assert len(ref_ranges) > 100 and len(ref_grams) > 10
    for name in ("four", "refused", "mixed", "unbuilt"):
        ranges, grams, _ = got[name]
        assert set(ranges) == set(ref_ranges) and set(grams) == set(ref_grams)
        for t, r in ranges.items():
            np.testing.assert_allclose(np.asarray(r.range_value), np.asarray(ref_ranges[t].range_value),
                                       rtol=1e-5, atol=1e-6, err_msg=f"{name} {t}")
        for t, gm in grams.items():
            a, b = (x.gram if hasattr(x, "gram") else x for x in (gm, ref_grams[t]))  # sums of products: the
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * np.abs(b).max(), err_msg=f"{name} {t}")  # scale
    # the exporter batches only where a call is bound by reading weights and the samples make enough calls
    assert batch_size(comp, g, 1 << 30, 1024) == 16
    assert batch_size(comp, g, 1 << 20, 1024) == 1 and batch_size(comp, g, 1 << 30, 64) == 1
    assert batch_size(comp, g, 1 << 30, 128) == 1  # 8 batched calls would not repay the export (MIN_CALLS)
