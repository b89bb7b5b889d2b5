"""Recipes are strict: unknown keys, missing reasons and malformed YAML are one-line errors."""
import pytest
import yaml

from omni_export.cli import main
from omni_export.errors import EXIT_BAD_INPUT, RecipeError
from omni_export.recipes import load_recipe, parse_recipe, shipped


def _data(name="spark_w8a16"):
    from importlib import resources
    return yaml.safe_load(resources.files("omni_export.recipes").joinpath(f"{name}.yaml").read_text())


def test_every_shipped_recipe_loads_and_every_threshold_has_a_reason():
    names = shipped()
    assert {"spark_w8a16", "spark_fp16", "spark_w8a8", "spark_w4a16_uncalibrated"} <= set(names)
    for n in names:
        r = load_recipe(n)
        for ths in r.thresholds.values():
            assert all(len(t.reason) > 20 for t in ths)


def test_unknown_key_is_an_error():
    d = _data()
    d["modle"] = d.pop("model")
    with pytest.raises(RecipeError, match=r"unknown key\(s\) \['modle'\]"):
        parse_recipe(d, "x")


def test_threshold_without_reason_is_an_error():
    d = _data()
    d["thresholds"]["w8a16"][0]["reason"] = ""
    with pytest.raises(RecipeError, match="has no reason"):
        parse_recipe(d, "x")


def test_build_without_thresholds_is_an_error():
    d = _data()
    del d["thresholds"]["w8a16"]
    with pytest.raises(RecipeError, match="has no thresholds for decode_step/w8a16"):
        parse_recipe(d, "x")


def test_unknown_scheme_and_target_fail_before_any_work(tmp_path, capsys):
    d = _data()
    d["builds"] = [{"target": "qnn_context", "scheme": "w3a3"}]
    d["thresholds"] = {"w3a3": d["thresholds"]["w8a16"]}
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump(d))
    assert main(["recipe", str(p), "--store", str(tmp_path / "s")]) == EXIT_BAD_INPUT
    assert "unknown scheme 'w3a3'" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_malformed_yaml_and_unknown_name(tmp_path, capsys):
    p = tmp_path / "bad.yaml"
    p.write_text("name: [unclosed\n")
    assert main(["recipe", str(p), "--store", str(tmp_path / "s")]) == EXIT_BAD_INPUT
    assert "not valid YAML" in capsys.readouterr().err
    assert main(["recipe", "no_such_recipe", "--store", str(tmp_path / "s")]) == EXIT_BAD_INPUT
    assert "no recipe named 'no_such_recipe'" in capsys.readouterr().err


def test_overrides():
    r = load_recipe("spark_w8a16").with_overrides(device="sm8650", context=256, preset="full")
    assert (r.device, r.context, r.model.preset) == ("sm8650", 256, "full")
    r = load_recipe("spark_w8a16").with_overrides(checkpoint="/x")
    assert r.model.preset is None and r.model.checkpoint == "/x"


def test_parts_override_applies_to_every_component_and_keeps_their_options():
    r = load_recipe("spark_w8a16").with_overrides(parts=2)
    assert r.options == {"decode_step": {"parts": 2}, "prefill": {"rows": 8, "prompt_tokens": 40, "parts": 2}}
    full = load_recipe("spark_w8a16").with_overrides(preset="full", parts=4)
    assert full.options["prefill"] == {"rows": 128, "prompt_tokens": 192, "simulator_calls": 1,
                                     "calibration_chunks": 6, "parts": 4}
