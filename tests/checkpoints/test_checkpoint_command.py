"""``omni-export checkpoint``: an out-of-range seed is a one-line exit 2 (not an internal error), and ``--force``
replaces only the files of the family's layout, refusing a directory whose other weight files would stand beside it."""
import pytest
import torch
from safetensors.torch import save_file

from omni_export.commands.cli import main
from omni_export.errors import EXIT_BAD_INPUT, EXIT_OK
from omni_export.families import build_model


@pytest.mark.parametrize("seed", [str(10**23), "-1", str(2**63)])
def test_an_out_of_range_seed_is_a_one_line_exit_2(seed, tmp_path, capsys):
    assert main(["checkpoint", str(tmp_path / "c"), "--seed", seed]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "seed" in err and "out of range" in err, err
    assert not (tmp_path / "c").exists()


def test_the_largest_seed_is_accepted(tmp_path):
    assert main(["checkpoint", str(tmp_path / "c"), "--seed", str(2**63 - 1)]) == EXIT_OK
    build_model("spark", checkpoint=tmp_path / "c")


def test_force_rewrites_a_layout_with_a_subdirectory_and_keeps_other_files(tmp_path):
    out = tmp_path / "q"
    assert main(["checkpoint", str(out), "--family", "qwen3_tts", "--seed", "1"]) == EXIT_OK
    (out / "README.md").write_text("mine")
    assert main(["checkpoint", str(out), "--family", "qwen3_tts", "--seed", "2", "--force"]) == EXIT_OK
    assert (out / "README.md").read_text() == "mine"
    got = build_model("qwen3_tts", checkpoint=out).module.state_dict()
    want = build_model("qwen3_tts", "tiny", seed=2).module.state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert not [p for p in tmp_path.iterdir() if p.name != "q"]  # no staging directory left behind


def test_force_refuses_weight_files_the_layout_would_not_name(tmp_path, capsys):
    out = tmp_path / "c"
    out.mkdir()
    save_file({"lm_head.weight": torch.zeros(2)}, str(out / "model-00002-of-00002.safetensors"))
    assert main(["checkpoint", str(out), "--force"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "holds model-00002-of-00002.safetensors, which the spark layout does not write" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"] and sorted(p.name for p in out.iterdir()) == [
        "model-00002-of-00002.safetensors"]


def test_unknown_preset_is_a_one_line_exit_2(tmp_path, capsys):
    assert main(["checkpoint", str(tmp_path / "c"), "--family", "llama", "--preset", "huge"]) == EXIT_BAD_INPUT
    assert "unknown preset 'huge' for llama" in capsys.readouterr().err
