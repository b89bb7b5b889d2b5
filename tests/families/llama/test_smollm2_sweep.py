"""``omni-export sweep smollm2_sweep``: the trained SmolLM2 decode step through fp16, the shipped w8a16, the naive
all-ops w8a16, w8a8 and the uncalibrated w4a16 (slow: five exports, CPU-QDQ parity and an HTP fp16 run)."""
import json
import shutil

import pytest

from shared_stores import SMOLLM2_ARGS

from omni_export.cli import main
from omni_export.errors import EXIT_OK
from omni_export.recipes import load_recipe
from omni_export.sweep import sweep_thresholds

SCHEMES = ("fp16", "w8a16", "w8a16_naive", "w8a8", "w4a16_uncalibrated")


def test_every_sweep_scheme_is_held_to_a_trained_weights_bar():
    r = load_recipe("smollm2_sweep")
    assert r.components == ("decode_step",) and r.calibration.max_samples >= 1024
    for s in SCHEMES[1:]:  # quantized schemes inherit the w8a16 bar, KLD included
        th, src = sweep_thresholds(r, "decode_step", s)
        bars = {t.metric: (t.min, t.max) for t in th}
        assert src in ("w8a16", "w8a16 (inherited)") and bars["kld_mean"] == (None, 5e-3)
        assert bars["kld_p99"] == (None, 5e-2) and bars["top1_agreement"] == (0.94, None)
        assert min(t.min for t in th if t.metric == "snr_db" and t.outputs == "logits") == 30
    th, _ = sweep_thresholds(r, "decode_step", "fp16")
    assert {t.metric for t in th} >= {"snr_db", "kld_mean"}


@pytest.mark.slow
def test_smollm2_sweep_passes_the_shipped_w8a16_and_blocks_the_broken_ones(tmp_path, shared_store):
    # the fp32 reference, calibration set, fp32 export and shipped w8a16 build are the smollm2_w8a16 recipe's
    # (same component keys): start from that store's step cache, as a user's second run would
    seed = shared_store("smollm2_w8a16", *SMOLLM2_ARGS)
    store = tmp_path / "store"
    shutil.copytree(seed.path / "cache", store / "cache", symlinks=True)
    code = main(["sweep", "smollm2_sweep", "--store", str(store), "--schemes", ",".join(SCHEMES),
                 "--simulator-steps", "8", "--no-sensitivity"])
    out = sorted((store / "runs" / "smollm2_sweep-sweep").glob("*/sweep.json"))[-1]
    rows = {r["scheme"]: r for r in json.loads(out.read_text())["sweep"]["rows"]}
    assert rows["w8a16"]["status"] == "pass", rows["w8a16"]
    assert rows["w8a16"]["logits_snr_db"] >= 30
    for broken in ("w8a16_naive", "w8a8", "w4a16_uncalibrated"):
        assert rows[broken]["status"] == "blocked", rows[broken]
        assert rows[broken]["logits_snr_db"] < 30  # the trained-weights bar: broken builds measured 2-28 dB
    # fp16 on the HTP simulator is held to its 45 dB bar, which is not re-derived on trained weights yet (issue
    # note): its verdict must follow its figure either way, and the sweep's exit code must follow the verdicts
    fp16 = rows["fp16"]
    assert fp16["runtime"].startswith("qnn-htp-simulator") and fp16["status"] in ("pass", "blocked"), fp16
    if fp16["logits_snr_db"] < 45:
        assert fp16["status"] == "blocked" and fp16["reasons"], fp16
    assert code == EXIT_OK
