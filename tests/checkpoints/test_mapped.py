"""Mapped fp32 weights: a large seeded model is written once as a checkpoint and its parameters are views of the
file; they equal the in-memory seeded weights, and ``release`` hands touched pages back."""
import numpy as np
import pytest
import torch

import omni_export.families as families
from omni_export.errors import CheckpointError
from omni_export.memory import peak_rss_bytes, reset_peak
from omni_export.families import build_model


@pytest.fixture
def map_everything(monkeypatch):
    monkeypatch.setattr(families, "MAP_ABOVE", 0)


def test_seeded_mapped_weights_equal_the_in_memory_ones(tmp_path, map_everything):
    mem = build_model("spark", "tiny", seed=0)
    mapped = build_model("spark", "tiny", seed=0, weights_cache=tmp_path)
    assert mapped.weights is not None and "mapped" in mapped.source
    ref = mem.module.state_dict()
    for k, v in mapped.module.state_dict().items():
        assert torch.equal(v, ref[k]), k
    (d,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    again = build_model("spark", "tiny", seed=0, weights_cache=tmp_path)  # reuses the written checkpoint
    assert again.weights_hash == mapped.weights_hash and len(list(tmp_path.iterdir())) == 1
    x = torch.randn(1, 3, mem.config.hidden_size)
    with torch.no_grad():
        assert torch.equal(mapped.module.lm_head(x), mem.module.lm_head(x))


def test_mapped_checkpoint_refuses_missing_keys(tmp_path, map_everything):
    from safetensors.torch import save_file
    mapped = build_model("spark", "tiny", seed=0, weights_cache=tmp_path / "w")
    state = {k: v.clone() for k, v in mapped.module.state_dict().items() if k != "lm_head.weight"}
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(__import__("json").dumps(mapped.family.config_to_hf(mapped.config)))
    save_file(state, str(ckpt / "model.safetensors"))
    with pytest.raises(CheckpointError, match="missing keys: lm_head.weight"):
        build_model("spark", checkpoint=ckpt)


def test_release_hands_back_touched_pages(tmp_path, map_everything, monkeypatch):
    import omni_export.checkpoints.mapped as mp
    monkeypatch.setattr(mp, "SHARD_BYTES", 1 << 20)
    from omni_export.families.spark.model import PRESETS
    import dataclasses
    cfg = dataclasses.replace(PRESETS["tiny"], vocab_size=65536, hidden_size=512)  # a 128 MiB embedding
    monkeypatch.setitem(PRESETS, "wide", cfg)
    b = build_model("spark", "wide", seed=0, weights_cache=tmp_path)
    emb = b.module.model.embedding.weight
    b.release()
    reset_peak()
    base = peak_rss_bytes()
    float(emb.sum())  # touch every page of the embedding
    touched = peak_rss_bytes() - base
    assert touched > 100 * 2**20
    b.release()
    reset_peak()
    assert peak_rss_bytes() - base < 32 * 2**20  # the pages are gone from this process
    assert np.isfinite(float(emb[0].sum()))  # and still readable (faulted back from the page cache)


def test_mapped_parts_run_and_export_like_the_in_memory_model(tmp_path, map_everything):
    """Part by part with pages released between parts: the same step outputs as the in-memory model, and the ONNX
    export of each part reads the mapped weights."""
    from omni_export.components.decoder_lm import DecodeStepComponent
    from omni_export.lowering.onnx_export import export_onnx
    from omni_export.runtimes.ort import ort_cpu
    mem = DecodeStepComponent(build_model("spark", "tiny", seed=0), 32, parts=2)
    comp = DecodeStepComponent(build_model("spark", "tiny", seed=0, weights_cache=tmp_path / "w"), 32, parts=2)
    prompt = [5, 9, 17, 33, 65, 7]
    a, gen_a = mem.run_tokens(mem.eager_runner(), prompt, n_new=4)
    b, gen_b = comp.run_tokens(comp.eager_runner(), prompt, n_new=4)
    assert gen_a == gen_b
    for k in a:  # ~1e-6: a mapped tensor's alignment can pick another (equally exact) fp32 kernel path
        assert np.abs(a[k] - b[k]).max() < 1e-4, k
    runners = {}
    for g in comp.each_graph():
        src = export_onnx(g.module, g, tmp_path / f"{g.name}.onnx")
        runners[g.name] = ort_cpu(src, [s.name for s in g.outputs])
    c, gen_c = comp.run_tokens(comp.chain(runners), prompt, n_new=4)
    assert gen_c == gen_a
    assert np.abs(c["logits"] - a["logits"]).max() < 1e-3
