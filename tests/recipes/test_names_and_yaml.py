"""Names are names and YAML is bounded: a recipe name that is a path, empty, ``..``, absolute or holds a NUL is one
line (exit 2) before any work, and nothing is written outside the store; a recipe argument that is a directory says
so; an alias bomb, a self-referring anchor, deep nesting and a repeated key are refused in well under a second."""
import time
from importlib import resources

import pytest
import yaml

from omni_export.commands.cli import main
from omni_export.errors import EXIT_BAD_INPUT, RecipeError
from omni_export.recipes.yaml_load import YAML_MAX_NODES
from omni_export.recipes import load_recipe, load_yaml, parse_recipe



def _data(name="spark_w8a16") -> dict:
    return yaml.safe_load(resources.files("omni_export.recipes").joinpath(f"{name}.yaml").read_text())

BAD_NAMES = ["../../escape_trav", "", "..", ".", "/abs/olute", "a\0b", "a/b", "a\\b", "-flag", "x" * 101, "tab\tname"]


def _write(path, data) -> str:
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _outside(root, store) -> list:
    """Every file under ``root`` that is not under ``store`` nor a recipe file of the test."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                  if p.is_file() and not p.is_relative_to(store) and p.suffix != ".yaml")


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_a_recipe_name_that_is_not_a_name_is_one_line_before_any_work(name, tmp_path, capsys):
    d = _data()
    d["name"] = name
    with pytest.raises(RecipeError, match=r"recipe r\.yaml: name: "):
        parse_recipe(d, "r.yaml")
    root = tmp_path / "S"
    root.mkdir()
    p = _write(tmp_path / "r.yaml", d)
    assert main(["recipe", p, "--store", str(root / "r")]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "name: " in err, err
    assert list(root.iterdir()) == [] and _outside(tmp_path, root / "r") == []


def test_a_good_name_keeps_loading():
    d = _data()
    d["name"] = "My_recipe-2.v1"
    assert parse_recipe(d, "r.yaml").name == "My_recipe-2.v1"


@pytest.mark.parametrize("arg", ["../../etc/passwd", "a\0b", "/abs/name", "sub/dir"], ids=repr)
def test_a_shipped_recipe_name_is_never_a_path(arg, capsys, tmp_path):
    with pytest.raises(RecipeError, match="no recipe named|a NUL byte is in the name"):
        load_recipe(arg)
    assert main(["recipe", arg, "--store", str(tmp_path / "s")]) == EXIT_BAD_INPUT
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()


def test_a_directory_named_like_a_recipe_says_it_is_a_directory(tmp_path, capsys):
    (tmp_path / "x.yaml").mkdir()
    assert main(["recipe", str(tmp_path / "x.yaml"), "--store", str(tmp_path / "s")]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "is a directory" in err and "does not exist" not in err
    assert main(["recipe", str(tmp_path / "y.yaml"), "--store", str(tmp_path / "s")]) == EXIT_BAD_INPUT
    assert "does not exist" in capsys.readouterr().err


def _bomb() -> list[str]:
    """A billion-laughs mapping (about 0.4 KB): 9 levels of 9 aliases each, 9**10 leaves once expanded."""
    lines = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, 10):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    return lines


@pytest.mark.parametrize("where", ["options", "unknown_key"])
def test_an_alias_bomb_is_refused_in_well_under_a_second(where, tmp_path, capsys):
    d = _data()
    d.pop("options")
    text = yaml.safe_dump(d) + f"{'options' if where == 'options' else 'bomb'}:\n  decode_step:\n" + \
        "".join(f"    {line}\n" for line in _bomb())
    p = tmp_path / "bomb.yaml"
    p.write_text(text)
    assert len(text.encode()) < 8_000
    t0 = time.monotonic()
    assert main(["recipe", str(p), "--store", str(tmp_path / "s")]) == EXIT_BAD_INPUT
    assert time.monotonic() - t0 < 1.0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"more than {YAML_MAX_NODES} nodes" in err, err
    assert not (tmp_path / "s").exists()


def test_an_alias_bomb_in_an_option_value_is_refused(capsys, tmp_path):
    value = "[" + ", ".join(["&a [x, x, x, x, x, x, x, x, x, x]"] + ["*a"] * 9) + "]"  # small: 100 leaves, accepted
    assert load_yaml(value)[1] == ["x"] * 10
    bomb = "{" + ", ".join(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}" if i else "x"] * 9) + "]" for i in range(10)) + "}"
    t0 = time.monotonic()
    assert main(["recipe", "spark_w8a16", "--store", str(tmp_path / "s"), "--option", f"prefill.rows={bomb}"]) == 2
    assert time.monotonic() - t0 < 1.0
    assert "--option prefill.rows=" in capsys.readouterr().err


def test_repeated_keys_are_refused_by_name(tmp_path, capsys):
    text = yaml.safe_dump(_data(), sort_keys=False).replace("context: 128\n", "context: 128\ncontext: 64\n", 1)
    p = tmp_path / "dup.yaml"
    p.write_text(text)
    with pytest.raises(RecipeError, match=r"is not valid YAML at line \d+, column 1: duplicate key 'context' "
                                          r"\(first on line \d+\)"):
        load_recipe(str(p))
    nested = yaml.safe_dump(_data(), sort_keys=False).replace("  seed: 0\n", "  seed: 0\n  seed: 1\n", 1)
    p.write_text(nested)
    assert main(["recipe", str(p), "--store", str(tmp_path / "s")]) == EXIT_BAD_INPUT
    assert "duplicate key 'seed'" in capsys.readouterr().err


@pytest.mark.parametrize("text,expected", [
    ("a: &a [1, *a]\n", "refers to itself"),
    ("a: " + "[" * 200 + "]" * 200 + "\n", "nested more than"),
    ("a: " + "[" * 5000 + "]" * 5000 + "\n", "nested more than"),
])
def test_self_reference_and_deep_nesting_are_one_line(text, expected, tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text(text)
    with pytest.raises(RecipeError, match=expected):
        load_recipe(str(p))


@pytest.mark.parametrize("edit,expected", [
    (lambda d: d["options"]["prefill"].update(rows=float("nan")), "options.prefill.rows"),
    (lambda d: d["options"]["prefill"].update(rows=float("-inf")), "options.prefill.rows"),
    (lambda d: d["model"].update(seed=10**23), "model.seed: Input should be less than or equal to 4294967295"),
    (lambda d: d["model"].update(seed=-1), "model.seed: Input should be greater than or equal to 0"),
    (lambda d: d.update(context=2**40), "context: Input should be less than or equal to 1048576"),
])
def test_non_finite_and_out_of_range_values_in_a_recipe(edit, expected):
    d = _data()
    edit(d)
    with pytest.raises(RecipeError, match=expected):
        parse_recipe(d, "r.yaml")


def test_an_oversized_recipe_file_is_refused_unread(tmp_path):
    p = tmp_path / "big.yaml"
    p.write_bytes(b"#" * ((1 << 20) + 1))
    with pytest.raises(RecipeError, match="bytes"):
        load_recipe(str(p))
