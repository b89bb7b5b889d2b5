"""Hugging Face safetensors directories: sharded bf16 with an index, exact fp32 upcast, and every bad layout refused
with one line."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

from ckpt_builders import hf_shapes, random_weights
from omni_export.checkpoints import open_checkpoint
from omni_export.errors import CheckpointError

CONFIG = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "tie_word_embeddings": True}


def _write_sharded(d, state: dict[str, torch.Tensor], n_shards: int = 2, index: bool = True):
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(CONFIG))
    keys = sorted(state)
    weight_map = {}
    for s in range(n_shards):
        name = f"model-{s + 1:05d}-of-{n_shards:05d}.safetensors"
        part = {k: state[k].contiguous() for k in keys[s::n_shards]}
        save_file(part, str(d / name))
        weight_map |= {k: name for k in part}
    if index:
        (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return weight_map


@pytest.fixture
def bf16_state():
    return {k: torch.from_numpy(v).to(torch.bfloat16) for k, v in random_weights(hf_shapes()).items()}


def _refused(path) -> str:
    with pytest.raises(CheckpointError) as e:
        open_checkpoint(path)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_sharded_bf16_upcasts_exactly(tmp_path, bf16_state):
    _write_sharded(tmp_path / "ck", bf16_state)
    ck = open_checkpoint(tmp_path / "ck")
    assert ck.source == "hf safetensors, 2 shards, indexed, bf16"
    assert ck.keys == {k: tuple(v.shape) for k, v in bf16_state.items()}
    assert "lm_head.weight" not in ck.keys and ck.config["tie_word_embeddings"] is True
    assert any("bf16 weights upcast to fp32" in n for n in ck.notes)
    assert "the checkpoint has no tokenizer" in ck.notes and ck.tokenizer is None
    for k, v in bf16_state.items():
        t = ck.tensor(k)
        assert t.dtype == torch.float32
        assert torch.equal(t, v.float())  # bf16 -> fp32 is exact
    with pytest.raises(CheckpointError, match="no tensor lm_head.weight"):
        ck.tensor("lm_head.weight")
    ck.close()
    with pytest.raises(CheckpointError, match="is closed"):
        ck.tensor("model.norm.weight")


def test_mixed_fp16_fp32_and_saved_tied_head(tmp_path):
    w = random_weights(hf_shapes(tied=False), seed=1)
    state = {k: torch.from_numpy(v).half() if v.ndim == 2 else torch.from_numpy(v) for k, v in w.items()}
    d = tmp_path / "ck"
    _write_sharded(d, state, n_shards=1, index=False)
    ck = open_checkpoint(d)
    assert ck.source == "hf safetensors, 1 shard, fp16+fp32"
    assert "lm_head.weight" in ck.keys  # reported as stored even though the config ties it
    assert any("lm_head.weight is saved although tie_word_embeddings" in n for n in ck.notes)
    assert torch.equal(ck.tensor("lm_head.weight"), state["lm_head.weight"].float())
    assert torch.equal(ck.tensor("model.norm.weight"), torch.from_numpy(w["model.norm.weight"]))


def test_weights_hash_is_content(tmp_path, bf16_state):
    _write_sharded(tmp_path / "a", bf16_state)
    _write_sharded(tmp_path / "b", bf16_state)
    changed = dict(bf16_state)
    changed["model.norm.weight"] = changed["model.norm.weight"].clone()
    changed["model.norm.weight"][0] += 1
    _write_sharded(tmp_path / "c", changed)
    ha, hb, hc = (open_checkpoint(tmp_path / n).weights_hash for n in "abc")
    assert ha == hb and ha != hc and len(ha) == 64


def test_stale_extra_shard_refused(tmp_path, bf16_state):
    d = tmp_path / "ck"
    _write_sharded(d, bf16_state)
    save_file({"lm_head.weight": torch.zeros(300, 64)}, str(d / "model-00003-of-00003.safetensors"))
    msg = _refused(d)
    assert "model-00003-of-00003.safetensors" in msg and "does not name" in msg


def test_duplicate_key_refused_without_index(tmp_path, bf16_state):
    d = tmp_path / "ck"
    _write_sharded(d, bf16_state, index=False)
    save_file({"model.norm.weight": torch.ones(64)}, str(d / "zz-extra.safetensors"))
    msg = _refused(d)
    assert "model.norm.weight" in msg and "zz-extra.safetensors" in msg and "both" in msg


def test_duplicate_key_refused_with_index(tmp_path, bf16_state):
    d = tmp_path / "ck"
    wm = _write_sharded(d, bf16_state)
    key = "model.norm.weight"
    other = next(v for v in wm.values() if v != wm[key])
    keep = {k: bf16_state[k] for k, v in wm.items() if v == other}
    save_file(keep | {key: bf16_state[key]}, str(d / other))
    msg = _refused(d)
    assert key in msg and other in msg


def test_index_naming_missing_shard_refused(tmp_path, bf16_state):
    d = tmp_path / "ck"
    wm = _write_sharded(d, bf16_state)
    gone = sorted(set(wm.values()))[1]
    (d / gone).unlink()
    msg = _refused(d)
    assert gone in msg and "missing" in msg


def test_key_the_index_names_but_file_lacks(tmp_path, bf16_state):
    d = tmp_path / "ck"
    _write_sharded(d, bf16_state)
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    idx["weight_map"]["lm_head.weight"] = "model-00001-of-00002.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps(idx))
    msg = _refused(d)
    assert "lacks key lm_head.weight" in msg and "model-00001-of-00002.safetensors" in msg


def test_key_in_a_file_the_index_puts_elsewhere(tmp_path, bf16_state):
    d = tmp_path / "ck"
    wm = _write_sharded(d, bf16_state)
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    key = sorted(wm)[0]
    idx["weight_map"][key] = next(v for v in sorted(set(wm.values())) if v != wm[key])
    (d / "model.safetensors.index.json").write_text(json.dumps(idx))
    msg = _refused(d)
    assert key in msg and "not where" in msg


@pytest.mark.parametrize("text, needle", [
    ("[1, 2]", "JSON list, not an object"),
    ("{not json", "not valid JSON"),
    (None, "no config.json"),
])
def test_bad_config_refused(tmp_path, bf16_state, text, needle):
    d = tmp_path / "ck"
    _write_sharded(d, bf16_state, n_shards=1, index=False)
    if text is None:
        (d / "config.json").unlink()
    else:
        (d / "config.json").write_text(text)
    assert needle in _refused(d)


def test_bad_index_and_dtypes_refused(tmp_path, bf16_state):
    d = tmp_path / "ck"
    _write_sharded(d, bf16_state)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": []}))
    assert "no weight_map" in _refused(d)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "../x.safetensors"}}))
    assert "not a .safetensors file name" in _refused(d)
    shutil.rmtree(d)
    _write_sharded(d, {"model.embed_tokens.weight": torch.zeros(3, 4, dtype=torch.int32)}, n_shards=1, index=False)
    assert "dtype I32" in _refused(d)
    (d / "model-00001-of-00001.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage}")
    assert "not a readable safetensors file" in _refused(d)
    (d / "model-00001-of-00001.safetensors").unlink()
    (d / "pytorch_model.bin").write_bytes(b"")
    assert "pytorch_model.bin is not read" in _refused(d)


def test_not_a_checkpoint(tmp_path):
    assert "does not exist" in _refused(tmp_path / "nope")
    (tmp_path / "x.bin").write_bytes(b"")
    assert "neither a directory" in _refused(tmp_path / "x.bin")


def test_tensors_are_read_one_at_a_time(tmp_path):
    """Reading every tensor of a bf16 checkpoint in turn keeps about one fp32 tensor resident, not the whole model."""
    from omni_export import memory

    n, numel = 16, 4 << 20  # 16 tensors of 16 MiB in fp32 (256 MiB for the whole state)
    state = {f"model.layers.{i}.mlp.up_proj.weight": torch.full((numel // 1024, 1024), float(i), dtype=torch.bfloat16)
             for i in range(n)}
    _write_sharded(tmp_path / "ck", state)
    del state
    ck = open_checkpoint(tmp_path / "ck")
    if not memory.reset_peak():
        pytest.skip("this platform cannot reset the resident-memory high-water mark")
    base = memory.current_rss_bytes()
    total = 0.0
    for k in sorted(ck.keys):
        t = ck.tensor(k)
        total += float(t[0, 0])
        del t
    assert total == sum(range(n))
    grew = memory.own_peak_rss_bytes() - base
    assert grew < n * numel * 4 / 3, f"peak grew {grew / 2**20:.0f} MiB while reading {n} tensors of 16 MiB"
