"""``omni-export calibrate``: the set a recipe run would capture, stored once in the step cache and reused."""
import dataclasses
import re

from omni_export.artifacts.store import Store
from omni_export.calibration.dataset import CalibrationSet
from omni_export.families import load_prompt_set
from omni_export.commands.cli import main
from omni_export.errors import EXIT_BAD_INPUT, EXIT_OK
from omni_export.pipeline import Pipeline
from omni_export.recipes import load_recipe


def test_calibrate_captures_once_and_the_pipeline_reuses_the_same_set(tmp_path, capsys):
    store = tmp_path / "store"
    assert main(["calibrate", "spark_w8a16", "--max-samples", "12", "--store", str(store)]) == EXIT_OK
    out = capsys.readouterr().out
    m = re.search(r"decode_step: calibration set ([0-9a-f]{64}) - 12 samples from prompt set 'spark_calibration'", out)
    assert m, out
    assert re.search(r"prefill: calibration set [0-9a-f]{64} - 12 samples", out), out  # one set per component
    done = list((store / "cache" / "calibration").glob("*/.done"))
    assert len(done) == 2
    done = [d for d in done if CalibrationSet.open(d.parent).hash == m.group(1)]
    stamp = done[0].stat().st_mtime_ns
    cs = CalibrationSet.open(done[0].parent)
    assert cs.hash == m.group(1) and cs.samples == 12 and len(list(cs)) == 12

    # a second capture is a cache hit: nothing rewritten, same hash printed
    assert main(["calibrate", "spark_w8a16", "--max-samples", "12", "--store", str(store)]) == EXIT_OK
    assert m.group(1) in capsys.readouterr().out
    assert done[0].stat().st_mtime_ns == stamp

    # the pipeline's own calibration step resolves to the very same directory (same key, same hash)
    r = load_recipe("spark_w8a16")
    r = dataclasses.replace(r, calibration=dataclasses.replace(r.calibration, max_samples=12))
    pipe = Pipeline(r, Store(store))
    comp = pipe.load_components()["decode_step"]
    again = pipe.calibration_set(comp, load_prompt_set(r.prompts.calibration))
    assert again.dir == cs.dir and again.hash == cs.hash


def test_calibrate_refuses_a_nonpositive_sample_count(tmp_path, capsys):
    assert main(["calibrate", "spark_w8a16", "--max-samples", "0", "--store", str(tmp_path)]) == EXIT_BAD_INPUT
    assert "--max-samples" in capsys.readouterr().err
