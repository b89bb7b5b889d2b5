"""The Spark AR-N prefill through ``omni-export hub submit`` (per-call parity inputs) over several parity prompts.

The prefill's host loop (``trace``) returns its sequences once every call is made; the payload records the calls as
one sequence in call order, so a budget that covers more than one prompt is sent whole (it stacked nothing for the
second prompt and stopped with "need at least one array to stack", exit 70). One store: the shipped spark_w8a16
recipe trimmed to the prefill's QDQ build (fewer calibration and parity tokens, same thresholds and options), built
by the real pipeline; the stand-in executes the uploaded graph on ONNX Runtime CPU.
"""
import json
from importlib import resources

import numpy as np
import pytest
import yaml

from omni_export.artifacts.store import Store
from omni_export.commands.cli import main
from omni_export.errors import EXIT_OK
from omni_export.families import load_prompt_set
from omni_export.hub.payload import device_trace, load_components, parity_inputs
from omni_export.recipes import load_recipe

from .standin import StandIn

TOKEN = "hubtest-token-prefill-3c1e"
ARTIFACT = "prefill.w8a16.qdq_onnx"


def test_every_prefill_call_of_several_prompts_is_sent_and_judged(tmp_path):
    from omni_export.hub.judging import device_verdict

    recipe = load_recipe("spark_w8a16")
    _, comps = load_components(recipe, Store(tmp_path))
    comp = comps["prefill"]
    pi = parity_inputs(comp, recipe, recipe.parity.simulator_steps)  # the default budget covers every prompt
    calls = len(pi.feeds[pi.names[0]])
    prompts = len(comp.encode_prompts(load_prompt_set(recipe.prompts.parity)))
    assert pi.mode == "per-call" and pi.steps == [calls] and calls > prompts > 1
    eager = comp.eager_runner()
    outs = [eager({n: pi.feeds[n][i] for n in pi.names}) for i in range(calls)]
    names = [s.name for s in comp.output_specs()]
    for k, n in enumerate(names):  # the reference is the eager graph's output of each recorded call, in order
        assert np.array_equal(pi.reference[0].outputs[n], np.stack([np.asarray(o[k], np.float32) for o in outs]))
    trace, _ = device_trace(pi, {n: [o[k] for o in outs] for k, n in enumerate(names)}, names,
                            [s.shape for s in comp.output_specs()])
    judged = device_verdict(pi, trace, comp, recipe, "w8a16")
    assert judged["parity"]["steps"] == calls and judged["verdict"]["status"] == "pass"


@pytest.fixture(scope="module")
def prefill_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub_prefill")
    d = yaml.safe_load(resources.files("omni_export.recipes").joinpath("spark_w8a16.yaml").read_text())
    d.pop("presets")
    d.update(name="spark_w8a16_prefill_hub", components=["prefill"], options={"prefill": d["options"]["prefill"]},
             builds=[{"target": "qdq_onnx", "scheme": "w8a16"}], calibration={"max_samples": 48, "new_tokens": 4},
             parity={"new_tokens": 4, "simulator_steps": 188})
    recipe = root / "r.yaml"
    recipe.write_text(yaml.safe_dump(d))
    store = root / "store"
    assert main(["recipe", str(recipe), "--store", str(store)]) == EXIT_OK
    return recipe, store


def test_hub_submit_of_the_prefill_over_several_prompts(prefill_store, tmp_path, monkeypatch, capsys):
    recipe, store = prefill_store
    s = StandIn(TOKEN, tmp_path / "standin")
    s.__enter__()
    try:
        monkeypatch.setenv("QAIHUB_CLIENT_INI", str(s.write_client_ini(tmp_path / "client.ini")))
        code = main(["hub", "submit", "--recipe", str(recipe), "--device", "galaxy_s25", "--store", str(store),
                     "--artifact", ARTIFACT, "--poll-seconds", "0.05", "--timeout-seconds", "300"])
    finally:
        s.__exit__(None, None, None)
    out = capsys.readouterr()
    assert code == EXIT_OK, out.err
    m = json.loads((store / "published" / "spark_w8a16_prefill_hub" / ARTIFACT / "manifest.json").read_text())
    h = m["hub"]["galaxy_s25"]
    assert h["parity"]["mode_key"] == "per-call" and h["inference"]["samples"] == h["parity"]["steps"] > 3
    assert h["verdict"]["status"] == "pass"
    assert h["parity"]["metrics"]["outputs"]["logits"]["snr_db"] >= 25
