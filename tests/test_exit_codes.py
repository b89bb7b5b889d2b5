"""Every exit code of docs/exit-codes.md, produced by a real command through ``omni_export.commands.cli.main``.

Produced for real: 0, 1 (a recipe the gate blocks, and ``gate`` on its store), 2, 5 (a store path under a
regular file), 6 (``hub devices`` with an AI Hub client that has no configuration; no network is touched).
Produced by the real code path with one thing taken away: 3 (``onnxruntime`` made unimportable while a cached
recipe reruns). Through monkeypatched internals, because the condition cannot be made here on purpose: 4 (the QNN
compiler made unavailable: ``qnn_context.htp_session`` raises, the exporter's own handling turns that into the
error), 70 (an unexpected exception inside ``recipes``), 130 (Ctrl-C inside ``recipes``)."""
import json
import sys

import pytest
import yaml

from omni_export import errors
from omni_export.commands.cli import main
from omni_export.recipes import load_recipe


@pytest.fixture(scope="module")
def w8a8_store(tmp_path_factory):
    """spark_w8a8 on the tiny preset: a real blocked artifact (~20 s)."""
    store = tmp_path_factory.mktemp("w8a8")
    assert main(["recipe", "spark_w8a8", "--store", str(store)]) == errors.EXIT_BLOCKED
    return store


def test_0_ok(capsys):
    assert main(["recipes"]) == errors.EXIT_OK == 0
    assert "spark_w8a16" in capsys.readouterr().out


@pytest.mark.slow
def test_1_blocked_by_the_recipe_and_by_the_gate(w8a8_store, capsys):
    assert (w8a8_store / "blocked" / "spark_w8a8").is_dir()  # produced by the fixture's `recipe` run (exit 1)
    assert main(["gate", "--store", str(w8a8_store)]) == errors.EXIT_BLOCKED == 1
    assert "blocked when it was built" in capsys.readouterr().out


def test_2_bad_input(tmp_path, capsys):
    assert main(["recipe", "no_such_recipe", "--store", str(tmp_path)]) == errors.EXIT_BAD_INPUT == 2
    assert "no recipe named 'no_such_recipe'" in capsys.readouterr().err
    assert main(["gate", "--store", str(tmp_path / "absent")]) == 2
    assert main(["report", "--store", str(tmp_path / "absent")]) == 2


@pytest.mark.slow
def test_3_missing_dependency(w8a8_store, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` now raises ImportError
    assert main(["recipe", "spark_w8a8", "--store", str(w8a8_store)]) == errors.EXIT_MISSING_DEP == 3
    assert "onnxruntime is not installed" in capsys.readouterr().err


@pytest.mark.slow
def test_4_unsupported(w8a8_store, tmp_path, monkeypatch, capsys):
    from omni_export.exporters import qnn_context
    from omni_export.lowering.parallel import PartPool
    from omni_export.runtimes import RuntimeUnavailable

    def no_compiler(*a, **k):
        raise RuntimeUnavailable("QNN HTP backend library missing")

    monkeypatch.setattr(qnn_context, "htp_session", no_compiler)
    # the compile runs in this process (not the fresh worker it gets in a recipe), so the missing backend is simulated
    monkeypatch.setattr(qnn_context, "PartPool", lambda n, job, isolated: PartPool(n, job))
    r = json.loads(json.dumps(load_recipe("spark_w8a8").to_dict()))  # plain lists and dicts for YAML
    r.update(name="w8a8_htp", builds=[{"target": "qnn_context", "scheme": "w8a8"}])
    path = tmp_path / "w8a8_htp.yaml"
    path.write_text(yaml.safe_dump(r))
    assert main(["recipe", str(path), "--store", str(w8a8_store)]) == errors.EXIT_UNSUPPORTED == 4
    assert "cannot compile a QNN context binary here" in capsys.readouterr().err


def test_5_io(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    assert main(["checkpoint", str(blocker / "ckpt")]) == errors.EXIT_IO == 5
    assert "cannot write" in capsys.readouterr().err


def _raise_in_recipes(monkeypatch, exc):
    import omni_export.recipes as recipes

    def boom(name):
        raise exc

    monkeypatch.setattr(recipes, "load_recipe", boom)
    return main(["recipes"])


def test_6_hub(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("QAIHUB_CLIENT_INI", str(tmp_path / "no-client.ini"))  # an AI Hub client with no configuration
    assert main(["hub", "devices"]) == errors.EXIT_HUB == 6
    assert "no AI Hub API token" in capsys.readouterr().err


def test_70_internal(monkeypatch, capsys):
    assert _raise_in_recipes(monkeypatch, ZeroDivisionError("a bug")) == errors.EXIT_INTERNAL == 70
    err = capsys.readouterr().err
    assert "internal error" in err and "--debug" in err and len(err.strip().splitlines()) == 1


def test_130_interrupted(monkeypatch, capsys):
    assert _raise_in_recipes(monkeypatch, KeyboardInterrupt()) == 130
    assert "interrupted" in capsys.readouterr().err


def test_2_checkpoint_refuses_a_file_and_a_non_empty_directory(tmp_path, capsys):
    f = tmp_path / "notes.txt"
    f.write_text("mine")
    assert main(["checkpoint", str(f)]) == errors.EXIT_BAD_INPUT
    assert "is a file, not a directory" in capsys.readouterr().err and f.read_text() == "mine"
    d = tmp_path / "dir"
    d.mkdir()
    (d / "mine.txt").write_text("keep me")
    (d / "config.json").write_text("{}")
    assert main(["checkpoint", str(d)]) == errors.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "is not empty (config.json, mine.txt)" in err and "--force" in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in d.iterdir()) == ["config.json", "mine.txt"]
    assert main(["checkpoint", str(d), "--force"]) == errors.EXIT_OK  # replaces only what it writes
    assert sorted(p.name for p in d.iterdir()) == ["config.json", "mine.txt", "model.safetensors"]
    assert (d / "mine.txt").read_text() == "keep me" and json.loads((d / "config.json").read_text())["hidden_size"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["checkpoint", str(empty)]) == errors.EXIT_OK
    assert sorted(p.name for p in empty.iterdir()) == ["config.json", "model.safetensors"]
    assert not list(tmp_path.rglob(".tmp-*"))


def test_recipe_hub_options_reach_the_hub_command_through_its_own_parser():
    """``recipe --hub`` builds no Namespace by hand: the hub command's parser reads the same options, defaults and all."""
    from omni_export.commands.cli import build_parser
    from omni_export.commands.options import hub_argv

    p = build_parser()
    args = p.parse_args(["recipe", "spark_w8a16", "--hub", "galaxy_s24", "--hub-dry-run", "--seed", "3", "--store", "S"])
    via_recipe = p.parse_args(hub_argv(args, args.name, args.hub, args.hub_dry_run))
    direct = p.parse_args(["hub", "submit", "--recipe", "spark_w8a16", "--device", "galaxy_s24", "--seed", "3",
                           "--store", "S", "--dry-run"])
    assert vars(via_recipe) == vars(direct) and via_recipe.seed == 3 and via_recipe.dry_run


def test_143_sigterm_during_an_import_waits_for_the_import(tmp_path, monkeypatch):
    """SIGTERM unwinds like Ctrl-C (exit 143, ``tests/artifacts/test_runs.py`` kills a real run), except while a module
    is being imported: an exception raised inside a native extension's initialization crashed the process
    (SIGSEGV or abort, 2 of 15 runs on a loaded machine while the exporters imported onnx lazily). There the handler
    returns and the signal is delivered again once the import can finish."""
    from omni_export.commands import cli
    again = []
    monkeypatch.setattr(cli, "_redeliver", again.append)
    (tmp_path / "slow_native_init.py").write_text(
        "import sys\nfrom omni_export.commands import cli\ncli._on_sigterm(15, sys._getframe())\nRESUMED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import slow_native_init  # the handler ran inside this import: it returned instead of raising
    assert slow_native_init.RESUMED and again == [15]
    with pytest.raises(cli.Terminated):  # outside an import: raised where the program is
        cli._on_sigterm(15, sys._getframe())
    assert again == [15] and not cli._importing(sys._getframe())


OUT_OF_RANGE = [
    ["hub", "submit", "--recipe", "spark_w8a16", "--steps", "0"],
    ["hub", "submit", "--recipe", "spark_w8a16", "--steps", "-3"],
    ["hub", "submit", "--recipe", "spark_w8a16", "--connect-timeout", "-1"],
    ["hub", "submit", "--recipe", "spark_w8a16", "--connect-timeout", "nan"],
    ["hub", "submit", "--recipe", "spark_w8a16", "--poll-seconds", "inf"],
    ["hub", "submit", "--recipe", "spark_w8a16", "--timeout-seconds", "0"],
    ["hub", "submit", "--recipe", "spark_w8a16", "--seed", str(10**23)],
    ["hub", "devices", "--connect-timeout", "nan"],
    ["recipe", "spark_w8a16", "--seed", str(10**23)],
    ["recipe", "spark_w8a16", "--seed", "-1"],
    ["recipe", "spark_w8a16", "--simulator-steps", "0"],
    ["recipe", "spark_w8a16", "--context", "1"],
]


@pytest.mark.parametrize("argv", OUT_OF_RANGE, ids=lambda a: " ".join(a[:2] + a[-2:]))
def test_2_an_option_value_out_of_range_is_one_usage_line(argv, tmp_path, capsys):
    """Non-finite, zero or negative counts and seconds, and seeds outside [0, 2**32), are refused by the parser (never
    ``hub --steps 0`` read as the recipe's budget), one line, exit 2, before anything is written."""
    with pytest.raises(SystemExit) as e:
        main([*argv, "--store", str(tmp_path / "s")])
    assert e.value.code == errors.EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"argument {argv[-2]}: expected" in err, err
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("extra,expected", [
    (["--context", str(10**12)], "context: Input should be less than or equal to 1048576"),
    (["--option", "prefill.rows=.nan"], "options.prefill.rows"),
    (["--option", "prefill.rows=-.inf"], "options.prefill.rows"),
])
def test_2_a_value_the_recipe_bounds_is_one_line(extra, expected, tmp_path, capsys):
    assert main(["recipe", "spark_w8a16", "--store", str(tmp_path / "s"), *extra]) == errors.EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err, err
    assert not (tmp_path / "s").exists()


def test_hub_submit_reads_every_option_of_the_recipe_run(tmp_path, capsys):
    """``hub submit --option`` (repeatable, as on ``recipe``) reaches the recipe it rebuilds: none is dropped."""
    from omni_export.commands.cli import build_parser

    args = build_parser().parse_args(["hub", "submit", "--recipe", "spark_w8a16", "--option", "prefill.rows=4",
                                      "--option", "prefill.prompt_tokens=8"])
    assert args.option == ["prefill.rows=4", "prefill.prompt_tokens=8"]
