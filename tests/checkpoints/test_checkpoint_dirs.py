"""Checkpoint directories: exact round trip, and one-line errors that name the bad key, with nothing written."""
import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from omni_export.commands.cli import main
from omni_export.errors import EXIT_BAD_INPUT, CheckpointError
from omni_export.families import build_model
from omni_export.checkpoints.hf import save_hf as save_checkpoint


def _write(tiny, path, mutate=None):
    fam = tiny.family
    state = {k: v.clone() for k, v in tiny.module.state_dict().items()}
    if mutate:
        mutate(state)
    save_checkpoint(state, fam.config_to_hf(tiny.config), path)
    return path


def _logits(bundle):
    from omni_export.components.decoder_lm import DecodeStepComponent
    comp = DecodeStepComponent(bundle, 64)
    outs, gen = comp.run_tokens(comp.eager_runner(), [1, 50, 60, 70], n_new=8)
    return outs["logits"], gen


def test_round_trip_reproduces_logits_exactly(tiny_spark, tmp_path):
    ck = _write(tiny_spark, tmp_path / "ckpt")
    loaded = build_model("spark", checkpoint=ck)
    a, ga = _logits(tiny_spark)
    b, gb = _logits(loaded)
    assert np.array_equal(a, b) and ga == gb
    assert loaded.config == tiny_spark.config
    assert loaded.source == "checkpoint ckpt"


def test_cli_writes_a_checkpoint_that_loads(tmp_path):
    assert main(["checkpoint", str(tmp_path / "c"), "--preset", "tiny", "--seed", "0"]) == 0
    assert json.loads((tmp_path / "c" / "config.json").read_text())["model_type"] == "spark2_5"
    build_model("spark", checkpoint=tmp_path / "c")


@pytest.mark.parametrize("mutate,needle", [
    (lambda s: s.pop("model.layers.1.mlp.up_proj.weight"), "missing keys: model.layers.1.mlp.up_proj.weight"),
    (lambda s: s.__setitem__("model.layers.0.extra.weight", torch.zeros(2)), "unexpected keys: model.layers.0.extra.weight"),
    (lambda s: s.__setitem__("model.norm.weight", torch.zeros(7)), "model.norm.weight has shape (7,), expected (256,)"),
])
def test_mismatched_keys_are_named(tiny_spark, tmp_path, mutate, needle):
    ck = _write(tiny_spark, tmp_path / "bad", mutate)
    with pytest.raises(CheckpointError) as e:
        build_model("spark", checkpoint=ck)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_corrupt_safetensors_is_a_clear_error(tiny_spark, tmp_path):
    ck = _write(tiny_spark, tmp_path / "corrupt")
    f = ck / "model.safetensors"
    f.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json" + f.read_bytes()[40:200])
    with pytest.raises(CheckpointError, match="model.safetensors is not a readable safetensors file"):
        build_model("spark", checkpoint=ck)


def test_missing_config_and_bad_json(tmp_path):
    (tmp_path / "a").mkdir()
    save_file({"x": torch.zeros(1)}, str(tmp_path / "a" / "model.safetensors"))
    with pytest.raises(CheckpointError, match="has no config.json"):
        build_model("spark", checkpoint=tmp_path / "a")
    (tmp_path / "a" / "config.json").write_text("{oops")
    with pytest.raises(CheckpointError, match="config.json is not valid JSON"):
        build_model("spark", checkpoint=tmp_path / "a")


def test_recipe_with_bad_checkpoint_exits_2_and_writes_nothing(tiny_spark, tmp_path, capsys):
    ck = _write(tiny_spark, tmp_path / "bad", lambda s: s.pop("lm_head.weight"))
    store = tmp_path / "store"
    code = main(["recipe", "spark_w8a16", "--checkpoint", str(ck), "--store", str(store)])
    assert code == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "missing keys: lm_head.weight" in err
    left = sorted(p.relative_to(store).as_posix() for p in store.rglob("*")) if store.exists() else []
    assert left in ([], [".lock"]), left  # no shelf, run report or cache step: at most the store's writer lock
