"""Every registered family reads its checkpoints through the checked reader (``checkpoints.hf``): what
``omni-export checkpoint`` writes for it loads back through ``build_model`` with the same weights, and a stale shard
beside an index or a key in two files is refused in one line, before any model is built."""
import json
import time

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import omni_export.families as families
from omni_export.checkpoints.mapped import MappedWeights
from omni_export.commands.cli import main
from omni_export.errors import EXIT_OK, CheckpointError
from omni_export.families import build_model, get_family


def _preset(name: str) -> str:
    presets = get_family(name).presets
    return "tiny" if "tiny" in presets else next(iter(presets))


def _write(family: str, out) -> None:
    assert main(["checkpoint", str(out), "--family", family, "--preset", _preset(family), "--seed", "3"]) == EXIT_OK


def _keys(f) -> list[str]:
    with safe_open(str(f), framework="pt") as h:
        return list(h.keys())


def _refusal(family: str, ckpt) -> str:
    with pytest.raises(CheckpointError) as e:
        build_model(family, checkpoint=ckpt)
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.parametrize("family", families.known())
def test_the_checkpoint_command_writes_what_the_family_loads_back(family, tmp_path):
    _write(family, tmp_path / "ckpt")
    seeded = build_model(family, _preset(family), seed=3)
    loaded = build_model(family, checkpoint=tmp_path / "ckpt")
    want, got = seeded.module.state_dict(), loaded.module.state_dict()
    assert got.keys() == want.keys()
    different = [k for k in want if not torch.equal(got[k], want[k])]
    assert different == [], different[:3]  # bit for bit: the layout's conversions are exact


@pytest.mark.parametrize("family", families.known())
def test_a_shard_the_index_does_not_name_is_refused(family, tmp_path):
    ckpt = tmp_path / "ckpt"
    _write(family, ckpt)
    keys = _keys(ckpt / "model.safetensors")
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: "model.safetensors" for k in keys}}))
    build_model(family, checkpoint=ckpt)  # the indexed layout loads
    save_file({keys[0]: torch.randn(4)}, str(ckpt / "model-00002-of-00002.safetensors"))
    msg = _refusal(family, ckpt)
    assert "shard model-00002-of-00002.safetensors lies next to model.safetensors.index.json" in msg


@pytest.mark.parametrize("family", families.known())
def test_a_key_in_two_files_is_refused(family, tmp_path):
    ckpt = tmp_path / "ckpt"
    _write(family, ckpt)
    key = _keys(ckpt / "model.safetensors")[-1]
    save_file({key: torch.randn(4)}, str(ckpt / "model-zz-extra.safetensors"))
    msg = _refusal(family, ckpt)
    assert f"key {key} is in both" in msg and "model.safetensors" in msg and "model-zz-extra.safetensors" in msg


def _spark_with_stray_head(tmp_path):
    """The probe's case: a Spark checkpoint with its index, and a stray shard holding a random lm_head beside it."""
    ckpt = tmp_path / "spark"
    _write("spark", ckpt)
    keys = _keys(ckpt / "model.safetensors")
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: "model.safetensors" for k in keys}}))
    cfg = get_family("spark").presets["tiny"]
    save_file({"lm_head.weight": torch.randn(cfg.vocab_size, cfg.hidden_size)}, str(ckpt / "model-stray.safetensors"))
    return ckpt


def test_spark_stray_lm_head_shard_is_refused_in_memory_and_mapped(tmp_path, monkeypatch):
    ckpt = _spark_with_stray_head(tmp_path)
    assert "shard model-stray.safetensors lies next to" in _refusal("spark", ckpt)
    monkeypatch.setattr(families, "MAP_ABOVE", 0)  # the full-size path: parameters mapped from the files
    assert "shard model-stray.safetensors lies next to" in _refusal("spark", ckpt)
    (ckpt / "model.safetensors.index.json").unlink()  # no index: the head is then in two files
    assert "key lm_head.weight is in both" in _refusal("spark", ckpt)


def test_spark_recipe_on_a_stray_shard_exits_2_and_publishes_nothing(tmp_path, capsys):
    ckpt = _spark_with_stray_head(tmp_path)
    store = tmp_path / "store"
    t0 = time.perf_counter()
    code = main(["recipe", "spark_w8a16", "--checkpoint", str(ckpt), "--store", str(store)])
    took = time.perf_counter() - t0
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "model-stray.safetensors lies next to model.safetensors.index.json" in err and len(err.splitlines()) == 1
    left = sorted(p.relative_to(store).as_posix() for p in store.rglob("*")) if store.exists() else []
    assert left in ([], [".lock"]), left  # no shelf, run report or cache step
    assert took < 60, took  # refused from the headers, before any export (a tiny run takes minutes)


def test_mapped_weights_refuse_a_key_in_two_files(tmp_path):
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_file({"w": torch.zeros(2)}, str(a))
    save_file({"w": torch.ones(2)}, str(b))
    with pytest.raises(CheckpointError, match="key w is in both a.safetensors and b.safetensors"):
        MappedWeights([a, b])
