"""Recipes are typed and strict: every bad input of a recipe file is one line naming the file, the key path and what
was expected, raised before any work; the published JSON Schemas are what the code declares."""
import copy
from importlib import resources
from pathlib import Path

import pytest
import yaml

from omni_export.commands import schemas
from omni_export.commands.cli import main
from omni_export.errors import EXIT_BAD_INPUT, RecipeError
from omni_export.recipes import load_recipe, parse_recipe, shipped, validate_options

DOCS = Path(__file__).resolve().parents[2] / "docs" / "schemas"


def _data(name="spark_w8a16"):
    return yaml.safe_load(resources.files("omni_export.recipes").joinpath(f"{name}.yaml").read_text())


def test_every_shipped_recipe_loads_round_trips_and_every_threshold_has_a_reason():
    names = shipped()
    assert {"spark_w8a16", "spark_fp16", "spark_w8a8", "spark_w4a16_uncalibrated"} <= set(names)
    for n in names:
        r = load_recipe(n)
        for ths in r.thresholds.values():
            assert all(len(t.reason) > 20 for t in ths)
        again = parse_recipe(r.to_dict(), "report.json")  # what the gate does with a run report's recipe
        assert again == r and again.hash == r.hash
        for p in r.presets:
            r.with_overrides(preset=p)


# Each bad input of the list (and a few more): the edit, then the exact one-line error.
BAD = [
    ("simulator_steps text", lambda d: d["parity"].update(simulator_steps="x"),
     "parity.simulator_steps: Input should be a valid integer (got 'x')"),
    ("simulator_steps negative", lambda d: d["parity"].update(simulator_steps=-1),
     "parity.simulator_steps: Input should be greater than or equal to 1 (got -1)"),
    ("min: high", lambda d: d["thresholds"]["w8a16"][0].update(min="high"),
     "thresholds.w8a16[0].min: Input should be a valid number, unable to parse string as a number (got 'high')"),
    ("reason: 5", lambda d: d["thresholds"]["w8a16"][0].update(reason=5),
     "thresholds.w8a16[0].reason: Input should be a valid string (got 5)"),
    ("seed: abc", lambda d: d["model"].update(seed="abc"), "model.seed: Input should be a valid integer (got 'abc')"),
    ("threshold list given as 5", lambda d: d["thresholds"].update(w8a16=5),
     "thresholds.w8a16: Input should be a valid tuple (got 5)"),
    ("unknown top-level key", lambda d: d.update(modle=d.pop("model")), "modle: unknown key (and 1 more error(s))"),
    ("unknown nested key", lambda d: d["thresholds"]["w8a16"][0].update(mni=3), "thresholds.w8a16[0].mni: unknown key"),
    ("missing key", lambda d: d.pop("device"), "device: required key missing"),
    ("empty reason", lambda d: d["thresholds"]["w8a16"][0].update(reason=""),
     "thresholds.w8a16[0]: threshold snr_db on 'logits' has no reason: every threshold says why"),
    ("both bounds", lambda d: d["thresholds"]["w8a16"][0].update(max=3),
     "thresholds.w8a16[0]: threshold snr_db on 'logits' needs exactly one of min or max"),
    ("build without thresholds", lambda d: d["thresholds"].pop("w8a16"),
     "build qdq_onnx/w8a16 has no thresholds for decode_step/w8a16"),
    ("options of an unknown component", lambda d: d["options"].update(decoder={}),
     "options names ['decoder']: expected components of the recipe ['decode_step', 'prefill']"),
    ("context too small", lambda d: d.update(context=1), "context: Input should be greater than or equal to 2 (got 1)"),
    ("expect_blocked text", lambda d: d.update(expect_blocked="yes"),
     "expect_blocked: Input should be a valid boolean (got 'yes')"),
    ("option value a list", lambda d: d["options"]["prefill"].update(rows=[8]), "options.prefill.rows"),
    ("preset with a bad type", lambda d: d["presets"]["full"]["parity"].update(new_tokens="a"),
     "presets.full.parity.new_tokens: Input should be a valid integer (got 'a')"),
    ("preset with an unknown key", lambda d: d["presets"]["full"].update(device="s24"), "presets.full.device: unknown key"),
    ("preset giving an invalid recipe", lambda d: d["presets"]["full"].update(context=1),
     "presets.full: context: Input should be greater than or equal to 2 (got 1)"),
]


@pytest.mark.parametrize("what,edit,expected", BAD, ids=[b[0] for b in BAD])
def test_bad_recipe_is_one_line_naming_file_and_key(what, edit, expected):
    d = copy.deepcopy(_data())
    edit(d)
    with pytest.raises(RecipeError) as e:
        parse_recipe(d, "my_recipe.yaml")
    msg = str(e.value)
    assert msg.startswith("recipe my_recipe.yaml: ") and expected in msg and "\n" not in msg


def test_bad_recipe_through_the_cli_fails_before_any_work(tmp_path, capsys):
    d = _data()
    d["thresholds"]["w8a16"][0]["min"] = "high"
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump(d))
    assert main(["recipe", str(p), "--store", str(tmp_path / "s")]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"recipe {p}: thresholds.w8a16[0].min" in err
    assert not (tmp_path / "s").exists()  # not even the store directory


def test_unknown_scheme_target_and_component_fail_before_any_work(tmp_path, capsys):
    for edit, expected in [
        (lambda d: d.update(builds=[{"target": "qnn_context", "scheme": "w3a3"}], thresholds={"w3a3": d["thresholds"]["w8a16"]}),
         "unknown scheme 'w3a3'"),
        (lambda d: d.update(builds=[{"target": "npu9000", "scheme": "w8a16"}]), "unknown target 'npu9000'"),
        (lambda d: d.update(components=["decode_step", "encoder"], options={}, presets={}), "has no component 'encoder'"),
        (lambda d: d.update(device="pixel_9"), "unknown device 'pixel_9'"),
        (lambda d: d.update(builds=[{"target": "onnx", "scheme": "w8a16"}]), "target onnx does not support scheme w8a16"),
    ]:
        d = _data()
        edit(d)
        p = tmp_path / "r.yaml"
        p.write_text(yaml.safe_dump(d))
        assert main(["recipe", str(p), "--store", str(tmp_path / "s")]) == EXIT_BAD_INPUT
        err = capsys.readouterr().err.strip()
        assert expected in err and len(err.splitlines()) == 1, err
        assert not (tmp_path / "s").exists()


def test_yaml_syntax_error_keeps_line_and_column(tmp_path, capsys):
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\ndescription: y\nmodel: {family: spark\ncontext: 2\n")
    with pytest.raises(RecipeError, match=r"recipe .*bad\.yaml is not valid YAML at line 4, column 8: "):
        load_recipe(str(p))
    assert main(["recipe", str(p), "--store", str(tmp_path / "s")]) == EXIT_BAD_INPUT
    assert main(["recipe", "no_such_recipe", "--store", str(tmp_path / "s")]) == EXIT_BAD_INPUT
    assert "no recipe named 'no_such_recipe'" in capsys.readouterr().err


def test_latin1_recipe_is_a_clear_error(tmp_path):
    p = tmp_path / "latin1.yaml"
    text = yaml.safe_dump(_data()).replace("description: ", "description: Caf\u00e9 ", 1)
    p.write_bytes(text.encode("latin-1"))
    with pytest.raises(RecipeError, match=r"latin1\.yaml: not UTF-8 text \(byte 0xe9 on line \d+\); save the file as UTF-8"):
        load_recipe(str(p))


def test_top_level_not_a_mapping():
    with pytest.raises(RecipeError, match=r"recipe x: \(top level\): expected a mapping, got list"):
        parse_recipe([1, 2], "x")


def test_overrides():
    r = load_recipe("spark_w8a16").with_overrides(device="sm8650", context=256, preset="full")
    assert (r.device, r.context, r.model.preset) == ("sm8650", 256, "full")
    r = load_recipe("spark_w8a16").with_overrides(checkpoint="/x")
    assert r.model.preset is None and r.model.checkpoint == "/x"
    with pytest.raises(RecipeError, match="override simulator_steps: Input should be greater than or equal to 1"):
        load_recipe("spark_w8a16").with_overrides(simulator_steps=-1)
    with pytest.raises(RecipeError, match="override context: Input should be greater than or equal to 2"):
        load_recipe("spark_w8a16").with_overrides(context=0)


def test_parts_override_applies_to_every_component_and_keeps_their_options():
    r = load_recipe("spark_w8a16").with_overrides(parts="2")
    assert r.options == {"decode_step": {"parts": 2}, "prefill": {"rows": 8, "prompt_tokens": 40, "parts": 2}}
    full = load_recipe("spark_w8a16").with_overrides(preset="full", parts="4")
    assert full.options["prefill"] == {"rows": 128, "prompt_tokens": 192, "simulator_calls": 1,
                                     "calibration_chunks": 6, "max_part_bytes": 1342177280, "parts": 4}
    assert full.options["decode_step"] == {"max_part_bytes": 1342177280, "parts": 4}
    assert load_recipe("spark_w8a16").with_overrides(parts="auto").options["decode_step"] == {"parts": "auto"}


def test_options_are_checked_against_the_factory_and_reach_it_validated():
    def factory(bundle, context: int, rows: int = 8, parts: "int | str" = "auto"):
        raise AssertionError("not called by validation")

    assert validate_options(factory, {"rows": 4}, "recipe r: options.prefill") == {"rows": 4}
    with pytest.raises(RecipeError, match=r"^recipe r: options.prefill.rows: Input should be a valid integer"):
        validate_options(factory, {"rows": "many"}, "recipe r: options.prefill")
    with pytest.raises(RecipeError, match=r"^recipe r: options.prefill.row: unknown key$"):
        validate_options(factory, {"row": 4}, "recipe r: options.prefill")


def test_published_json_schemas_are_current():
    """``python -m omni_export.commands.schemas docs/schemas`` rewrites them."""
    for name, schema in schemas.schemas().items():
        assert (DOCS / name).read_text() == schemas.render(schema), f"docs/schemas/{name} is stale"
    recipe = schemas.schemas()["recipe.schema.json"]
    assert recipe["additionalProperties"] is False and "thresholds" in recipe["properties"]


def test_option_override_reaches_the_component_options_and_bad_ones_are_one_line_errors():
    """``--option COMPONENT.KEY=VALUE`` (issue: component options fit the checkpoint): merged over the recipe's, VALUE
    read as YAML; an unknown component, a malformed option or an unknown key is a one-line RecipeError."""
    from omni_export.errors import RecipeError
    from omni_export.recipes import load_recipe

    r = load_recipe("spark_w8a16").with_overrides(option=["prefill.rows=8", "decode_step.parts=2"])
    assert r.options["prefill"]["rows"] == 8 and r.options["decode_step"]["parts"] == 2
    for bad, says in (("nope.rows=1", "has no component 'nope'"), ("prefill.rows", "expected COMPONENT.KEY=VALUE"),
                      ("rows=3", "expected COMPONENT.KEY=VALUE")):
        with pytest.raises(RecipeError) as e:
            load_recipe("spark_w8a16").with_overrides(option=[bad])
        assert says in str(e.value) and "\n" not in str(e.value)


def test_a_recipe_names_the_schemes_its_sweep_runs():
    """``sweep_schemes``: what ``omni-export sweep NAME`` runs without ``--schemes`` (smollm2_sweep: the five that
    matter on trained weights, not the sweep's own list, whose histogram calibrations over 1,024 samples it does not
    need); ``--schemes`` wins; an unknown scheme is a one-line error, in the recipe or on the command line."""
    from omni_export.commands.sweep import SCHEMES, schemes_for

    r = load_recipe("smollm2_sweep")
    assert schemes_for(r, None) == ("fp16", "w8a16", "w8a16_naive", "w8a8", "w4a16_uncalibrated")
    assert schemes_for(r, "fp16,w8a8") == ("fp16", "w8a8")
    assert schemes_for(load_recipe("spark_w8a16"), None) == SCHEMES
    with pytest.raises(RecipeError, match="unknown scheme 'w9a9'"):
        schemes_for(r, "w9a9")
    with pytest.raises(RecipeError, match="names no scheme"):
        schemes_for(r, "")
    text = (Path(__file__).parents[2] / "omni_export" / "recipes" / "smollm2_sweep.yaml").read_text()
    with pytest.raises(RecipeError, match=r"sweep_schemes names unknown schemes \['w9a9'\]") as e:
        parse_recipe(yaml.safe_load(text.replace("sweep_schemes: [fp16,", "sweep_schemes: [w9a9, fp16,")), "r.yaml")
    assert "\n" not in str(e.value)
