"""``omni-export hub submit --recipe R --device galaxy_s25`` reaches the AI Hub client for every shipped recipe
(one per distinct set of components it builds: ``_recipes``).

The hub builds a recipe's components through the pipeline's own loader (the recipe's options included: before,
``spark_w8a16``'s prefill exited 70 on "rows 128 vs window 16"), and takes any component kind. Per recipe, a store
holds one stored QDQ artifact of its first component, with the manifest a run writes for it (model hashes, IO,
pinned recipe) and a graph the service cannot compile: the command gets past the component build, checks the
device against the service's list, uploads the artifact and submits the compile job; the stand-in's compile fails,
and the artifact is blocked with the job's own reason.
"""
import dataclasses
import json

import pytest

from omni_export.artifacts.hashing import hash_bytes
from omni_export.artifacts.store import Store
from omni_export.commands.cli import main
from omni_export.errors import EXIT_BLOCKED
from omni_export.hub.payload import load_components
from omni_export.recipes import load_recipe, shipped

from .standin import StandIn

TOKEN = "hubtest-token-every-recipe-0d9c"
GRAPH = b"not an onnx graph"
TRAINED_ROW = "smollm2_w8a16"  # the trained checkpoints' one row (``_recipes``)


def _fake_store(root, recipe):
    """A store as `omni-export recipe` leaves it, for one QDQ artifact of the recipe's first component."""
    store = Store(root)
    bundle, comps = load_components(recipe, store)
    comp = comps[recipe.components[0]]
    aid = f"{comp.name}.w8a16.qdq_onnx"
    d = root / "published" / recipe.name / aid
    d.mkdir(parents=True)
    (d / "model.onnx").write_bytes(GRAPH)
    manifest = {
        "artifact": {"id": aid, "component": json.loads(json.dumps(comp.describe())), "format": "onnx",
                     "files": {"model.onnx": {"sha256": hash_bytes(GRAPH), "bytes": len(GRAPH), "role": "model"}}},
        "recipe": {"name": recipe.name, "hash": recipe.hash, "file": f"recipes/{recipe.hash}.json"},
        "model": bundle.provenance(), "scheme": {"name": "w8a16"}, "target": {"name": "qdq_onnx"},
        "parity": {"runtime": "onnxruntime-cpu", "metrics": None},
        "verdict": {"status": "pass", "reasons": [], "checks": []},
    }
    (d / "manifest.json").write_text(json.dumps(manifest))
    (root / "recipes").mkdir(exist_ok=True)
    (root / "recipes" / f"{recipe.hash}.json").write_text(json.dumps(recipe.to_dict()))
    return aid, comp


def _recipes():
    """One shipped recipe per distinct (model, components, component options, context): what the hub builds its
    components from (recipes that differ only in builds, bars or prompts build the same components). A trained
    checkpoint's recipes (loading it is most of their time: ``slow``) count once, as ``TRAINED_ROW`` (the smallest
    trained checkpoint), whose row takes the hub through a packaged checkpoint and its tokenizer; every trained recipe's
    components, options and contexts reach the loader the same way as the seeded recipes', which each have a row, and
    each trained family's loader is tested on its own checkpoint (``tests/families/llama/test_llama_smollm2.py``,
    ``tests/families/gemma3/test_gemma3_270m.py``)."""
    assert load_recipe(TRAINED_ROW).model.checkpoint
    first = {"trained": TRAINED_ROW}
    for n in shipped():
        r = load_recipe(n)
        key = ("trained" if r.model.checkpoint else
               json.dumps([dataclasses.asdict(r.model), list(r.components), r.to_dict().get("options"), r.context],
                          sort_keys=True, default=str))
        first.setdefault(key, n)
    return [pytest.param(n, marks=pytest.mark.slow) if load_recipe(n).model.checkpoint else n for n in first.values()]


@pytest.mark.parametrize("name", _recipes())
def test_hub_submit_reaches_the_client_and_a_failed_compile_blocks(name, tmp_path, monkeypatch, capsys):
    recipe = load_recipe(name)
    aid, comp = _fake_store(tmp_path / "store", recipe)
    s = StandIn(TOKEN, tmp_path / "standin")
    s.__enter__()
    try:
        monkeypatch.setenv("QAIHUB_CLIENT_INI", str(s.write_client_ini(tmp_path / "client.ini")))
        code = main(["hub", "submit", "--recipe", name, "--device", "galaxy_s25", "--store", str(tmp_path / "store"),
                     "--artifact", aid, "--poll-seconds", "0.05", "--timeout-seconds", "60"])
        assert s.count("PUT", "files/model", prefix=True) == 1 and s.count("POST", "api/v1/jobs") == 1
    finally:
        s.__exit__(None, None, None)
    out = capsys.readouterr().out
    assert code == EXIT_BLOCKED, out
    m = json.loads((tmp_path / "store" / "blocked" / name / aid / "manifest.json").read_text())
    h = m["hub"]["galaxy_s25"]
    job = h["compile"]["job_id"]
    assert h["compile"]["status"] == "FAILED" and h["compile"]["failure"]
    assert m["verdict"]["status"] == "blocked"
    assert m["verdict"]["reasons"] == [f"on-device (galaxy_s25, AI Hub): AI Hub compile job {job} failed: "
                                       f"{h['compile']['failure']}"]
    assert f"AI Hub compile job {job} failed" in out
    assert not (tmp_path / "store" / "published" / name / aid).exists()


@pytest.mark.parametrize("name,component", [("qwen3_tts_w8a16", "code2wav"), ("spark_w8a16", "prefill")])
def test_components_without_a_token_loop_are_sent_call_by_call(name, component, tmp_path):
    """A vocoder chunk or a prefill is not refused: its host loop's graph calls are recorded with the fp32 graph's
    outputs, and a device returning exactly those outputs scores the SNR cap on every output."""
    from omni_export.hub.judging import device_verdict
    from omni_export.hub.payload import device_trace, parity_inputs
    from omni_export.parity.metrics import SNR_CAP

    recipe = load_recipe(name)
    _, comps = load_components(recipe, Store(tmp_path))
    comp = comps[component]
    pi = parity_inputs(comp, recipe, 3)
    assert pi.mode == "per-call" and sum(pi.steps) >= 1 and len(pi.feeds[pi.names[0]]) == sum(pi.steps)
    eager = comp.eager_runner()
    outs = [eager({n: pi.feeds[n][i] for n in pi.names}) for i in range(sum(pi.steps))]
    names = [s.name for s in comp.output_specs()]
    got = {n: [o[k] for o in outs] for k, n in enumerate(names)}
    trace, how = device_trace(pi, got, names, [s.shape for s in comp.output_specs()])
    judged = device_verdict(pi, trace, comp, recipe, "w8a16")
    assert how == "by name" and judged["parity"]["steps"] == sum(pi.steps)
    assert {o: v["snr_db"] for o, v in judged["parity"]["metrics"]["outputs"].items()} == {n: SNR_CAP for n in names}
    assert judged["verdict"]["status"] == "pass" and judged["verdict"]["checks"]
    assert set(judged["parity"]["not_measured"]) <= {"top1_agreement", "greedy_agreement", "max_logprob_delta",
                                                     "log_mel_distance"}
