"""Every MiniCPM-o speech graph exports to ONNX (the project's exporter: dynamo, opset 21) and runs on ORT CPU as
eager PyTorch does, on the inputs its host loop feeds."""
import numpy as np
import onnxruntime as ort
import pytest

from omni_export.families.minicpmo.config import PRESETS
from omni_export.families.minicpmo.flow_host import FlowHost, schedule
from omni_export.families.minicpmo.graphs import dit_step, eager, encoder_chunk, f0_window, hift_window
from omni_export.families.minicpmo.hift import nsf_harmonics
from omni_export.families.minicpmo.model import MiniCPMOSpeech, init_random
from omni_export.lowering.onnx_export import export_onnx
from omni_export.parity.metrics import snr_db

CFG = PRESETS["tiny"]


@pytest.fixture(scope="module")
def model():
    return init_random(MiniCPMOSpeech(CFG), 0).eval()


def _feeds(model, name):
    """What the host feeds the graph (recorded from its own loop), so masks, caches and padding are realistic."""
    host, rng = FlowHost(model.flow, CFG, 20), np.random.default_rng(0)
    chunks = schedule(rng.integers(0, 6561, 10), rng.integers(0, 6561, 60), 25)
    if name == "hift":
        mel = (0.5 * rng.standard_normal((1, 80, 100))).astype(np.float32)
        return {"mel": mel, "harmonics": nsf_harmonics(np.full(100, 150.0), CFG.hift,
                                                       rng.standard_normal((9, 48000)))[None].astype(np.float32)}
    if name == "f0":
        return {"mel": (0.5 * rng.standard_normal((1, 80, 66))).astype(np.float32)}
    got = []
    enc = {S: eager(encoder_chunk(model, S, host.cap1)) for S in (10, 25)}
    mus, _ = host.encode_stream(enc, chunks, record=got.append)
    if name == "encoder":
        return got[-1]                                     # the last, short chunk: padded rows and masks
    got = []
    runs = {F: eager(dit_step(model, F, host.cap2)) for F in (20, 50)}
    host.dit_stream(runs, mus, np.ones(80, np.float32), np.zeros((80, 20), np.float32),
                    rng.standard_normal((80, 400)).astype(np.float32), record=got.append)
    return got[-15]                                        # a mid-chunk Euler step with a filled cache


GRAPHS = {"dit": lambda m: dit_step(m, 50, 120), "encoder": lambda m: encoder_chunk(m, 25, 60),
          "hift": lambda m: hift_window(m, 100), "f0": lambda m: f0_window(m, 66)}


@pytest.mark.parametrize("name", list(GRAPHS))
def test_graph_exports_and_matches_eager(model, name, tmp_path):
    g = GRAPHS[name](model)
    feed = _feeds(model, name)
    assert {s.name: s.shape for s in g.inputs} == {k: v.shape for k, v in feed.items()}
    path = export_onnx(g.module, g, tmp_path / f"{name}.onnx")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == [s.name for s in g.inputs]
    got = sess.run([s.name for s in g.outputs], feed)
    ref = eager(g)(feed)
    for spec, a, b in zip(g.outputs, got, ref):
        assert a.shape == b.shape == spec.shape
        assert snr_db(b, a) > 100.0, spec.name                # fp32 on both sides: op-order rounding only
