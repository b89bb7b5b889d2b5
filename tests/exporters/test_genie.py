"""Target ``genie``: the tiny Spark bundle (AR-N prompt processor + AR-1 token generator) runs inside Genie (libGenie on
the HTP simulator) and generates fp32's greedy ids, past the sliding window; the gate refuses a Genie-form graph with a
wrong mask fill or a transposed-K mistake, and a bundle whose files do not match its genie_config.json; a component or
scheme the target cannot serve is a one-line error."""
import json
import shutil

import numpy as np
import pytest
import torch

from omni_export.components.decoder_genie import GenieStep, step_adapter
from omni_export.components.decoder_lm import DecodeStepComponent
from omni_export.components.decoder_prefill import PrefillComponent
from omni_export.devices import get_device
from omni_export.errors import UnsupportedError
from omni_export.exporters import get_target
from omni_export.exporters.base import ExportRequest
from omni_export.exporters.genie import CONFIG, bundle_problems, byte_tokenizer_json, genie_generate, prompt_rows
from omni_export.quantize.genie_qdq import same_weight_encodings
from omni_export.blocks.layers import MASK_VALUE
from omni_export.parity import gate
from omni_export.parity.execute import FIRST_TOKENS, generated
from omni_export.parity.metrics import compare
from omni_export.recipes import load_recipe
from omni_export.runtimes import RuntimeUnavailable
from omni_export.schemes import get_scheme

TOKENS = [1] + [int(t) for t in np.random.RandomState(2).randint(3, 4000, 15)]
N_NEW = 16  # 16 + 16 positions: the window of 16 is crossed


def thresholds():
    return list(load_recipe("spark_w8a16").thresholds_for("decode_step", "fp16"))


def eager(module):
    @torch.no_grad()
    def run(feed):
        args = (torch.from_numpy(np.ascontiguousarray(feed[n])) for n in module.input_names)
        return [o.numpy() for o in module(*args)]
    return module.input_names, run


def judged(comp, module):
    """The gate's verdict on a Genie-form AR-1 graph run under the decode step's host loop, fed as Genie feeds it (as
    the target's teacher-forced figures are measured), against the eager fp32 reference, with the recipe's bars."""
    names, run = eager(module)
    ref = comp.reference(_prompts(), {"max_prompt_tokens": 16, "new_tokens": N_NEW})
    # the teacher-forced figures (the greedy ids are Genie's: judged in Genie below)
    got = comp.trace(step_adapter(comp, names, run), ref, None, forced_only=True)
    report = compare(ref, got, True, first_step=comp.parity_first_step)
    bars = [t for t in thresholds() if t.metric != "greedy_agreement"]
    return gate.judge(report, bars, [s.name for s in comp.output_specs()])


def _prompts():
    from omni_export.components.base import PromptSet
    return PromptSet("genie-test", ("The quick brown fox", "Numbers: 1 2 3"))


class WrongMaskFill(GenieStep):
    """The mistake of a graph built for a 1 / 0 (visible / masked) mask fill, which it turns into an additive one:
    under Genie's 0 / -1000 fill every slot reads as masked."""

    def forward(self, *inputs):
        env = dict(zip(self.input_names, inputs))
        env["attention_mask"] = (env["attention_mask"] - 1.0) * -MASK_VALUE
        return super().forward(*(env[n] for n in self.input_names))


class KNotTransposed(GenieStep):
    """The mistake of reading Genie's transposed K cache [nkv,1,hd,P] as if it were [nkv,1,P,hd] (a reshape, no
    transpose): the shapes fit, the function does not."""

    def forward(self, *inputs):
        env = dict(zip(self.input_names, inputs))
        for n in env:
            if n.startswith("past_key_") and n.endswith("_in"):
                k = env[n]
                env[n] = k.reshape(k.shape[0], 1, k.shape[3], k.shape[2]).transpose(2, 3)
        return super().forward(*(env[n] for n in self.input_names))


@pytest.fixture(scope="module")
def comp(tiny_spark):
    return DecodeStepComponent(tiny_spark, 64)


def test_the_genie_form_graph_passes_the_gate(comp, tiny_spark):
    v = judged(comp, GenieStep(tiny_spark.module, 64, 1).eval())
    assert v["status"] == gate.PASS, v["reasons"]


def test_a_wrong_mask_fill_is_refused(comp, tiny_spark):
    v = judged(comp, WrongMaskFill(tiny_spark.module, 64, 1).eval())
    assert v["status"] == gate.BLOCKED and any("snr_db" in r for r in v["reasons"]), v


def test_a_transposed_k_mistake_is_refused(comp, tiny_spark):
    v = judged(comp, KNotTransposed(tiny_spark.module, 64, 1).eval())
    assert v["status"] == gate.BLOCKED and any("k_new" in r or "logits" in r for r in v["reasons"]), v


def test_the_byte_tokenizer_ships_as_a_tokenizers_file():
    from tokenizers import Tokenizer

    from omni_export.checkpoints.tokenizer import byte_tokenizer
    tok, ref = Tokenizer.from_str(byte_tokenizer_json(4096)), byte_tokenizer(4096)
    for s in ("The quick brown fox", "héllo ✓", "  two\nlines"):
        assert tok.encode(s).ids == ref.encode(s)
        assert tok.decode(ref.encode(s)) == s
    assert tok.get_vocab_size() == 4096


def test_a_component_or_scheme_it_cannot_serve_is_one_line(tiny_spark, tmp_path):
    t = get_target("genie")
    pre = PrefillComponent(tiny_spark, 64, rows=8)
    with pytest.raises(UnsupportedError, match="not a decoder LM's decode_step") as e:
        t.accepts(pre)  # pipeline.check_thresholds asks every build's target, before any export
    assert "\n" not in str(e.value)
    with pytest.raises(UnsupportedError, match="not a decoder LM's decode_step"):
        t.export(ExportRequest(pre, get_scheme("fp16"), get_device("galaxy_s25"), None, None), tmp_path)
    t.accepts(DecodeStepComponent(tiny_spark, 64))
    assert "w4a16" not in t.schemes  # the recipe check refuses it before any work (pipeline.check)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, comp):
    try:
        from omni_export.runtimes.genie import genie_library
        from omni_export.runtimes.ort import require_qnn
        require_qnn()
        genie_library()
    except RuntimeUnavailable as e:
        pytest.skip(f"no Genie / QNN here: {e}")
    out = tmp_path_factory.mktemp("genie")
    built = get_target("genie").export(ExportRequest(comp, get_scheme("fp16"), get_device("galaxy_s25"), None, None),
                                       out)
    return built


def test_prompt_rows_are_a_quarter_of_the_context_never_half():
    """Genie 2.51 reads an AR-N graph's transposed K rows with the wrong stride when N = C/2 (measured:
    tests/runtimes/test_genie_dialog.py); AI Hub Models' bundles use AR-128."""
    assert [prompt_rows(c) for c in (4, 8, 64, 128, 512, 4096)] == [None, 2, 16, 32, 128, 128]
    assert all(prompt_rows(c) is None or 2 * prompt_rows(c) != c for c in range(2, 2049))


def test_tiny_spark_bundle_generates_fp32s_greedy_ids_in_genie(bundle, comp):
    """The prompt runs through the AR-16 binary (41 tokens: 3 calls, the last padded), generation through AR-1: Genie's
    ids are fp32's and the logits its sampler sees are fp32's up to fp16 noise, past the window of 16."""
    from omni_export.components.decoder_lm import reference_logits
    assert bundle_problems(bundle.dir, bundle.info) == []
    assert bundle.info["variants"] == {
        "prompt processor": {"ar": 16, "graphs": ["prompt_ar16_cl64_1_of_1"]},
        "token generator": {"ar": 1, "graphs": ["token_ar1_cl64_1_of_1"]}}
    cfg = json.loads((bundle.dir / CONFIG).read_text())["dialog"]
    assert cfg["engine"]["model"]["binary"]["ctx-bins"] == list(bundle.info["ctx_bins"])
    assert list(bundle.info["ctx_bins"]) == ["prompt_ar16_cl64_1_of_1_ctx_qnn.bin", "token_ar1_cl64_1_of_1_ctx_qnn.bin"]
    longer = [1] + [int(t) for t in np.random.RandomState(3).randint(3, 4000, 40)]
    want = [comp.run_tokens(comp.eager_runner(), p, n_new=N_NEW)[1] for p in (TOKENS, longer)]
    res = genie_generate(bundle.dir, bundle.info, [TOKENS, longer], [N_NEW, N_NEW])
    assert res["refused"] is None
    assert res["ids"] == want
    for p, ids, logits in zip((TOKENS, longer), want, res["logits"]):
        ref = reference_logits(comp.bundle.module, p + ids[:-1])[len(p) - 1:]
        assert logits.shape == ref.shape == (N_NEW, comp.cfg.vocab_size)
        assert np.abs(logits - ref).max() < 0.1  # fp16 HTP: measured 0.02


def test_a_prompt_longer_than_genie_takes_is_refused_with_the_limit_named(bundle):
    """The bundle records the longest prompt Genie takes with its AR-16 prompt processor at context 64 (64 - 16 + 1:
    tests/runtimes/test_genie_dialog.py measures the rule); a longer parity prompt is refused with that limit named,
    not handed to Genie (which would answer only "Context Size was exceeded")."""
    assert bundle.info["max_prompt_tokens"] == 49
    res = genie_generate(bundle.dir, bundle.info, [TOKENS, [1] + [7] * 49], [N_NEW, N_NEW])
    assert res["ids"] == [[], []] and res["refused"].startswith("not handed to Genie: a prompt of 50 tokens")
    assert "at most 49" in res["refused"]


@pytest.mark.parametrize("edit", ["missing_bin", "context", "rope_theta", "stale_bin"])
def test_a_bundle_that_does_not_match_its_config_is_refused(bundle, comp, tmp_path, edit):
    d = tmp_path / "b"
    shutil.copytree(bundle.dir, d)
    cfg = json.loads((d / CONFIG).read_text())
    if edit == "missing_bin":
        cfg["dialog"]["engine"]["model"]["binary"]["ctx-bins"].append("weights_2_of_2.bin")
    elif edit == "context":
        cfg["dialog"]["context"]["size"] = 256
    elif edit == "rope_theta":
        cfg["dialog"]["engine"]["backend"]["QnnHtp"]["rope-theta"] = 500000
    else:
        b = next(iter(bundle.info["ctx_bins"]))  # the prompt processor's
        with open(d / b, "r+b") as f:
            f.seek(4096)
            f.write(b"\x00" * 16)
    (d / CONFIG).write_text(json.dumps(cfg))
    assert bundle_problems(d, bundle.info)
    ref = comp.reference(_prompts(), {"max_prompt_tokens": 16, "new_tokens": 4})
    got = comp.trace(lambda feed: [np.zeros(s.shape, np.float32) for s in comp.output_specs()], ref, None)
    from functools import partial
    figures = generated(partial(genie_generate, d, bundle.info), ref, got)
    assert "does not match genie_config.json" in figures["refused"]
    report = compare(ref, got, True, first_step=comp.parity_first_step)
    v = gate.judge(report, [t for t in thresholds() if t.metric == "greedy_agreement"], ["logits"])
    assert v["status"] == gate.BLOCKED and "greedy_agreement was not measured" in v["reasons"][0]


@pytest.mark.slow
def test_a_two_part_bundle_chains_in_genie(tiny_spark, tmp_path):
    """Parts named <variant>_<k>_of_<n> inside their binaries: Genie chains them by tensor name (hidden_2)."""
    try:
        from omni_export.runtimes.genie import genie_library
        genie_library()
    except RuntimeUnavailable as e:
        pytest.skip(f"no Genie here: {e}")
    comp = DecodeStepComponent(tiny_spark, 64, parts=2)
    built = get_target("genie").export(ExportRequest(comp, get_scheme("fp16"), get_device("galaxy_s25"), None, None),
                                       tmp_path)
    assert built.info["variants"]["token generator"]["graphs"] == ["token_ar1_cl64_1_of_2", "token_ar1_cl64_2_of_2"]
    _, want = comp.run_tokens(comp.eager_runner(), TOKENS, n_new=8)
    res = genie_generate(built.dir, built.info, [TOKENS], [8])
    assert res["refused"] is None and res["ids"] == [want]


# -- w8a16: the decode step's QDQ policy on Genie's graph, judged inside Genie and on the same binaries by the bars --
def w8a16_thresholds():
    return list(load_recipe("spark_w8a16").thresholds_for("decode_step", "w8a16"))


@pytest.fixture(scope="module")
def calibration(tmp_path_factory, comp):
    from omni_export.calibration.dataset import write_set
    from omni_export.families import load_prompt_set
    from omni_export.components.base import PromptSet
    full = load_prompt_set("spark_calibration")
    cal, opts = PromptSet(f"{full.name}[:3]", full.prompts[:3]), {"max_prompt_tokens": 16, "new_tokens": 8}
    feeds, total = comp.calibration_feeds(cal, opts), comp.calibration_steps(cal, opts)
    return write_set(tmp_path_factory.mktemp("cal"), feeds, total, 32, cal.name, cal.hash), (cal, opts)


def quantized_bundle(tmp_path_factory, comp, calibration, scheme):
    try:
        from omni_export.runtimes.genie import genie_library
        from omni_export.runtimes.ort import require_qnn
        require_qnn()
        genie_library()
    except RuntimeUnavailable as e:
        pytest.skip(f"no Genie / QNN here: {e}")
    cal, trace_set = calibration
    return get_target("genie").export(ExportRequest(comp, get_scheme(scheme), get_device("galaxy_s25"), cal, None,
                                                    trace_set=trace_set), tmp_path_factory.mktemp(f"genie-{scheme}"))


def gated(built, comp, steps: int, in_genie: bool = True):
    """The gate's verdict on ``built`` with the recipe's w8a16 bars, measured as the pipeline measures it: teacher-
    forced figures from the bundle's binaries through onnxruntime's QNN EP, greedy ids and logits from Genie."""
    ex = get_target("genie").execution(built, comp, get_device("galaxy_s25"))
    ref = comp.reference(_prompts(), {"max_prompt_tokens": 8, "new_tokens": 8})
    got = comp.trace(ex.run, ref, steps, forced_only=True)
    report = compare(ref, got, True, first_step=comp.parity_first_step)
    gen = report["generator"] = generated(ex.generate, ref, got) if in_genie else None
    return gate.judge(report, w8a16_thresholds(), [s.name for s in comp.output_specs()]), report, gen


def test_tiny_w8a16_bundle_runs_in_genie_within_the_w8a16_bars(tmp_path_factory, comp, calibration):
    built = quantized_bundle(tmp_path_factory, comp, calibration, "w8a16")
    assert bundle_problems(built.dir, built.info) == []
    encs = built.info["io"]["encodings"]
    enc, prompt = encs["token_ar1_cl64_1_of_1"], encs["prompt_ar16_cl64_1_of_1"]
    assert enc["attention_mask"]["zero_point"] == 65535 and enc["attention_mask"]["type"] == "uint16"  # 0 exact
    for i in range(comp.cfg.num_hidden_layers):  # a row Genie copies from out to in keeps its code, in either program
        for kv in ("key", "value"):
            assert enc[f"past_{kv}_{i}_in"] == enc[f"past_{kv}_{i}_out"] == prompt[f"past_{kv}_{i}_in"] == \
                prompt[f"past_{kv}_{i}_out"]  # Genie keeps one cache for both programs
    policy = built.info["quantization"]["component_policy"]
    assert policy["token_ar1_cl64_1_of_1"]["int16_weights"] == policy["prompt_ar16_cl64_1_of_1"]["int16_weights"]
    assert "identical scales and zero points in AR-1 and AR-16" in built.info["weight_encodings"]
    assert "union of the programs' calibrated ranges" in \
        built.info["quantization"]["shared_encodings"]["K/V cache groups of every program"]
    # the prompt processor, which computes position 0 in Genie, has ranges of its own, as calibrated; the token
    # generator keeps the decode step's widened ones; both leave the residual stream's Adds and RMSNorms float (so the
    # norms' weights stay unquantized in both: the weight encodings above stay one set)
    token, prompt = policy["token_ar1_cl64_1_of_1"], policy["prompt_ar16_cl64_1_of_1"]
    assert "activation_range_margin" in token and "activation_range_margin" not in prompt
    # each program's policy recorded whole, as data: its name and every setting
    assert token["settings"]["range_margin"] == 2.0 and token["settings"]["weight_scales"] == "mse"
    assert prompt["settings"]["range_margin"] == 1.0 and prompt["settings"]["weight_scales"] == "shared"
    assert prompt["settings"]["scales_from"] == "token_ar1_cl64_1_of_1" and prompt["policy"].endswith("prompt processor")
    assert len(token["float_nodes"]) == len(prompt["float_nodes"]) > 0
    assert token["settings"]["float_ops"] == prompt["settings"]["float_ops"] == ["rmsnorm", "residual_add"]
    assert built.info["htp_precision"].endswith("float nodes in fp16 (enable_htp_fp16_precision)")
    ranges = built.info["quantization"]["activation_ranges"]
    assert "position 0, the attention sink, included" in ranges["prompt processor (AR-16)"]
    assert "sink-free" in ranges["token generator (AR-1)"]
    verdict, report, gen = gated(built, comp, 12)
    assert verdict["status"] == gate.PASS, verdict["reasons"]
    bar = next(t.min for t in w8a16_thresholds() if t.metric == "snr_db" and t.outputs == "logits")
    assert gen["refused"] is None and gen["positions"] > 0 and gen["logits_snr_db"] > bar  # Genie's own logits
    # Genie reaches every parity prompt: the traced one whole, the first tokens of the others (``FIRST_TOKENS``)
    assert gen["prompts"] == len(gen["new_tokens"]) > 1 and max(gen["new_tokens"][1:]) <= FIRST_TOKENS


def test_the_prompt_processor_calibrates_on_genies_prompt_calls_from_position_0(comp, calibration):
    """Genie sends every prompt through the AR-N program, so AR-N computes position 0 (the attention sink): its
    calibration feeds are Genie's calls over the calibration prompts, each prompt's first call with its first token
    at position 0 in row 0; the token generator keeps the decode step's sink-free samples."""
    cal, (prompts, opts) = calibration
    form, ar = comp.genie(), prompt_rows(comp.context)
    P = comp.context - ar
    graphs = form.graphs(ar, "prompt")
    ids = form.prompt_ids(prompts, opts["max_prompt_tokens"])
    feeds = list(form.calibration_feeds(cal, graphs, graphs[0].name, ids))
    assert len(feeds) == sum(-(-len(t) // ar) for t in ids)  # every call Genie makes, no more
    at_0 = [f for f in feeds if (f["attention_mask"][0, 0, 0, :P] < 0).all()]  # no past slot visible: position 0
    assert [int(f["input_ids"][0, 0]) for f in at_0] == [t[0] for t in ids]
    assert all(f["attention_mask"][0, 0, 0, P] == 0 for f in at_0)  # row 0 sees itself
    token = form.graphs(1, "token")
    for f in form.calibration_feeds(cal, token, token[0].name):  # sink-free: every sample sees a past slot
        assert (f["attention_mask"][0, 0, 0, :comp.context - 1] == 0).any()
    with pytest.raises(UnsupportedError, match="calibrates on the calibration prompts"):
        next(form.calibration_feeds(cal, graphs, graphs[0].name))


def test_cache_ranges_are_unioned_across_programs_past_a_constant_in_the_group(tmp_path):
    """A K/V group may hold a constant (SmolLM2's tied LM head reaches a MatMul's second input): it has no calibrated
    range in either program and is left alone; an activation is unioned; one ranged in a single program is refused."""
    from types import SimpleNamespace

    from onnxruntime.quantization.calibrate import TensorData, TensorsData, load_tensors_data, save_tensors_data

    from omni_export.errors import CalibrationError
    from omni_export.quantize.genie_qdq import share_cache_ranges
    from omni_export.quantize.policy import Plan

    def part(name, ranges, group):
        cache = tmp_path / f"{name}.json"
        save_tensors_data(TensorsData("minmax", {t: TensorData(lowest=np.float32(lo), highest=np.float32(hi))
                                                for t, (lo, hi) in ranges.items()}), cache)
        return SimpleNamespace(graph=SimpleNamespace(name=name), cache=cache, plan=Plan(rhs_int16=[group]))

    group = ["past_key_0_in", "lm_head.weight"]
    token = part("token", {"past_key_0_in": (-1, 2)}, group)
    prompt = part("prompt", {"past_key_0_in": (-3, 1)}, group)
    assert "1 K/V group tensors" in share_cache_ranges([token], {16: [prompt]})
    for p in (token, prompt):
        assert [float(v) for v in load_tensors_data(p.cache)["past_key_0_in"].range_value] == [-3.0, 2.0]
    one = part("one", {"past_key_0_in": (-1, 1), "lm_head.weight": (0, 1)}, group)
    with pytest.raises(CalibrationError, match="lm_head.weight has a calibrated range in one of"):
        share_cache_ranges([one], {16: [part("other", {"past_key_0_in": (-1, 1)}, group)]})


def test_programs_that_quantize_a_weight_differently_are_refused(tmp_path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def qdq(name, scale):
        w = numpy_helper.from_array(np.arange(4, dtype=np.int8).reshape(2, 2), "w_quantized")
        s, z = numpy_helper.from_array(np.float32(scale), "w_scale"), numpy_helper.from_array(np.int8(0), "w_zp")
        g = helper.make_graph([helper.make_node("DequantizeLinear", ["w_quantized", "w_scale", "w_zp"], ["y"])], "g",
                              [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])], [w, s, z])
        onnx.save(helper.make_model(g), str(tmp_path / name))
        return tmp_path / name

    a, b, c = qdq("a.onnx", 0.1), qdq("b.onnx", 0.1), qdq("c.onnx", 0.2)
    assert "1 quantized weights, identical" in same_weight_encodings({1: [a], 16: [b]})
    with pytest.raises(Exception, match="AR-16 and AR-1 quantize 1 weights differently"):
        same_weight_encodings({1: [a], 16: [c]})


def test_an_int8_activation_bundle_is_blocked(tmp_path_factory, comp, calibration):
    """w8a8 (uint8 activations, the decode step's policy does not apply) on the same calibration: the gate blocks it."""
    built = quantized_bundle(tmp_path_factory, comp, calibration, "w8a8")
    verdict, report, _ = gated(built, comp, 4, in_genie=False)
    assert verdict["status"] == gate.BLOCKED
    assert any("logits snr_db" in r for r in verdict["reasons"]), verdict["reasons"]


def test_a_bundle_genie_refuses_is_blocked_under_bars_without_a_greedy_one(bundle, comp, tmp_path):
    """Quantized builds have no greedy bar (teacher-forced figures judge them): Genie's refusal blocks by itself."""
    d = tmp_path / "b"
    shutil.copytree(bundle.dir, d)
    cfg = json.loads((d / CONFIG).read_text())
    cfg["dialog"]["context"]["size"] = 256
    (d / CONFIG).write_text(json.dumps(cfg))
    ref = comp.reference(_prompts(), {"max_prompt_tokens": 16, "new_tokens": 4})
    from functools import partial
    got = comp.trace(comp.eager_runner(), ref, None, forced_only=True)  # figures that pass every bar
    report = compare(ref, got, True, first_step=comp.parity_first_step)
    report["generator"] = generated(partial(genie_generate, d, bundle.info), ref, got)
    assert not any(t.metric == "greedy_agreement" for t in w8a16_thresholds())
    v = gate.judge(report, w8a16_thresholds(), [s.name for s in comp.output_specs()])
    assert v["status"] == gate.BLOCKED and v["reasons"] == [
        f"the artifact's own runtime refused it: {report['generator']['refused']}"]


def test_a_compile_job_is_sized_by_its_source_weights(tmp_path):
    """Genie's compiles run side by side only where their estimate fits (``parallel.part_workers``): a float
    source's estimate counts its ONNX file and external data at ``FP16_COMPILE_PER_BYTE`` (the trained Gemma 3's two
    1.07 GB sources, side by side, peaked at 18.4 GiB with the pipeline), a QDQ source's at qnn_context's rate."""
    from omni_export.exporters.genie import FP16_COMPILE_PER_BYTE, compile_job_bytes
    from omni_export.exporters.qnn_context import COMPILE_PER_BYTE
    from omni_export.lowering.parallel import WORKER_BASE

    for name, size in (("a", 1000), ("b", 3000)):
        (tmp_path / f"{name}.onnx").write_bytes(b"\0" * 100)
        (tmp_path / f"{name}.onnx.data").write_bytes(b"\0" * size)
    srcs = [tmp_path / "a.onnx", tmp_path / "b.onnx"]
    assert compile_job_bytes(srcs, True) == int(WORKER_BASE + FP16_COMPILE_PER_BYTE * 3100)
    assert compile_job_bytes(srcs, False) == int(WORKER_BASE + COMPILE_PER_BYTE * 3100)
