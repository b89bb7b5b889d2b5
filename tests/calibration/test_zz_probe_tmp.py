import json
from omni_export.calibration import mixed
from omni_export.parity import gate
from omni_export.parity.gate import Threshold
from omni_export.schemes import get_scheme
def test_probe(small, monkeypatch):
    out = small.dir / "p2"; out.mkdir()
    real = gate.judge
    def judge(rep, th, names):
        print("REP", {k: v["snr_db"] for k, v in rep["outputs"].items()}, rep.get("lm"))
        return real(rep, th, names)
    monkeypatch.setattr(mixed.gate, "judge", judge)
    th = (Threshold("snr_db", "logits", min=200.0, reason="probe"),)
    try:
        mixed.quantize_mixed(small.src, out / "model.onnx", small.calibration, lambda f: f, get_scheme("w8a16_mixed"), th, small.graph, small.comp, small.trace_set)
    except Exception as e:
        print("ERR", e)
