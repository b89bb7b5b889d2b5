"""Automatic mixed precision: the smallest prefix of the sensitivity ranking raised to int16 that clears the bar."""
import pytest

from omni_export.quantize.mixed import quantize_mixed
from omni_export.errors import UnsupportedError
from omni_export.parity.gate import Threshold
from omni_export.runtimes.ort import cpu_session
from omni_export.schemes import get_scheme

# A stricter bar than the deployable 25 dB, for this test only. Driven over the calibration prompts, plain w8a16 on
# this two-layer graph measures 39.0 dB logits SNR, 4 raised weights 40.1 dB, 8 raised 43.8 dB, every weight at int16
# 73.3 dB: 40 dB sits between, so plain w8a16 must fail it and a few raised layers must clear it.
STRICT = (Threshold("snr_db", "logits", min=40.0, reason="stricter than deployable: exercises the search"),
          Threshold("top1_agreement", min=0.9, reason="the deployable top-1 bar"),
          Threshold("greedy_agreement", min=0.9, reason="free-running: only the gate can measure it"))


def _int16_weights(path):
    import onnx
    m = onnx.load(str(path), load_external_data=False)
    return {i.name.removesuffix("_quantized") for i in m.graph.initializer
            if i.name.endswith(".weight_quantized") and i.data_type == onnx.TensorProto.INT16}


def test_a_failing_w8a16_bar_is_met_by_a_minimal_set_of_int16_weights(small, tmp_path):
    dst = tmp_path / "model.onnx"
    info = quantize_mixed(small.src, dst, small.calibration, lambda f: f, get_scheme("w8a16_mixed"), STRICT,
                          small.graph, small.comp, small.trace_set)
    trials = {t["raised"]: t for t in info["trials"]}
    assert trials[0]["status"] == "blocked"  # plain w8a16 fails the strict bar...
    k = info["raised_layers"]
    assert 0 < k < info["quantized_layers"] and trials[k]["status"] == "pass"  # ...a few raised layers pass it
    assert trials[k - 1]["status"] == "blocked"  # and one fewer does not: the smallest passing prefix
    assert trials[k]["figures"]["logits snr_db"] > trials[0]["figures"]["logits snr_db"]
    order = [r["weight"] for r in sorted((r for r in info["sensitivity"]["layers"] if r["quantized"]),
                                         key=lambda r: r["weight_snr_db"])]
    assert list(info["overrides"]) == order[:k] and set(info["overrides"].values()) == {"int16"}
    assert [t["metric"] for t in info["thresholds"]] == ["snr_db", "top1_agreement", "greedy_agreement"]
    # the shipped file carries exactly the recorded overrides, and runs
    assert _int16_weights(dst) == set(info["overrides"])
    assert dst.with_name(dst.name + ".data").exists()
    cpu_session(dst)
    assert not list(tmp_path.glob(".mixed-*"))  # candidates cleaned up


def test_plain_w8a16_is_kept_when_it_already_passes(small, tmp_path):
    bar = (Threshold("snr_db", "logits", min=25.0, reason="the deployable bar"),)
    info = quantize_mixed(small.src, tmp_path / "model.onnx", small.calibration, lambda f: f,
                          get_scheme("w8a16_mixed"), bar, small.graph, small.comp, small.trace_set)
    assert info["overrides"] == {} and len(info["trials"]) == 1 and info["sensitivity"] is None


@pytest.mark.slow  # climbs the whole ladder: 7 quantization passes
def test_refused_when_even_every_weight_at_int16_cannot_pass(small, tmp_path):
    impossible = (Threshold("snr_db", "logits", min=120.0, reason="beyond 16-bit activations: must refuse"),)
    with pytest.raises(UnsupportedError, match=r"even with all 13 weights of model at int16, logits snr_db = .*"
                                               r"required >= 121 on the calibration prompts"):  # the bar + SELECTION_MARGIN_DB
        quantize_mixed(small.src, tmp_path / "model.onnx", small.calibration, lambda f: f,
                       get_scheme("w8a16_mixed"), impossible, small.graph, small.comp, small.trace_set)
    assert not list(tmp_path.iterdir())


def test_refused_without_thresholds_to_aim_at(small, tmp_path):
    with pytest.raises(UnsupportedError, match="nothing for the mixed-precision search to aim at"):
        quantize_mixed(small.src, tmp_path / "model.onnx", small.calibration, lambda f: f,
                       get_scheme("w8a16_mixed"), (), small.graph, small.comp, small.trace_set)
