"""``parity_from``: a decode step's parity that executes from a position past the sliding window, the rows before it
being fp32's (as a prefill writes a prompt's rows in deployment), so a bounded simulator budget is spent where the
sliding layers' ring has wrapped."""
from __future__ import annotations

import numpy as np
import pytest

from omni_export.components.decoder_lm import DecodeStepComponent
from omni_export.components.decoder_prefill import PrefillComponent
from omni_export.families import PromptSet
from omni_export.parity.metrics import compare

START = 20  # tiny Spark's window is 16: its ring of 15 rows has wrapped by position 20


def _long_prompt() -> PromptSet:
    return PromptSet.from_text("long", " ".join(f"w{i % 7}" for i in range(30)) + "\n")  # 32 byte tokens kept


def _position(feed) -> int:
    return int(np.count_nonzero(feed["mask_full"] == 0)) - 1  # the full mask opens the pos cached rows + its own


def test_parity_from_executes_past_the_window_and_compares_only_what_the_graph_computed(tiny_spark):
    comp = DecodeStepComponent(tiny_spark, context=48, parity_from=START)
    assert comp.parity_first_step == START and comp.describe()["parity_from"] == START
    assert "parity_from" not in DecodeStepComponent(tiny_spark, context=48).describe()  # cache keys unchanged
    assert "parity_from" not in PrefillComponent(tiny_spark, context=48, rows=8).describe()  # it compares from row 0
    prompts = _long_prompt()
    ref = comp.reference(prompts, {"max_prompt_tokens": 32, "new_tokens": 4})
    assert ref[0].n_prompt > START
    eager, positions = comp.eager_runner(), []

    def artifact(feed):  # wrong by 1 % everywhere: only the rows it computed may carry that error
        positions.append(_position(feed))
        return [o * np.float32(1.01) for o in eager(feed)]

    trace = comp.trace(artifact, ref, None, forced_only=True)
    assert positions == list(range(START, len(ref[0].tokens)))  # no graph call before START
    for n, v in trace[0].outputs.items():  # the rows before START are fp32's own
        assert np.array_equal(v[:START], ref[0].outputs[n][:START]), n
    got = compare(ref, trace, lm=True, first_step=START)
    assert got["steps"] == len(ref[0].tokens) - START and got["lm"]["first_position"] == START
    assert all(o["snr_db"] < 41 for o in got["outputs"].values())  # the 1 % error, not diluted by fp32's rows

    positions.clear()  # a budget of N is N graph calls from START
    budget = comp.trace(artifact, ref, 3, forced_only=True)
    assert positions == [START, START + 1, START + 2] and compare(ref, budget, lm=False, first_step=START)["steps"] == 3


def test_parity_from_refuses_prompts_it_cannot_start_inside_and_values_out_of_range(tiny_spark):
    comp = DecodeStepComponent(tiny_spark, context=48, parity_from=START)
    short = comp.reference(PromptSet.from_text("short", "w1 w2 w3\n"), {"max_prompt_tokens": 32, "new_tokens": 4})
    with pytest.raises(ValueError, match=f"parity_from {START} needs parity prompts longer than that"):
        comp.trace(comp.eager_runner(), short, None)
    for bad in (0, 48, 2.0, True):
        with pytest.raises(ValueError, match="parity_from must be an integer from 1 to context - 1"):
            DecodeStepComponent(tiny_spark, context=48, parity_from=bad)


def test_a_free_run_follows_fp32_before_parity_from_and_the_artifact_after_it(tiny_spark):
    comp = DecodeStepComponent(tiny_spark, context=48, parity_from=START)
    prompts = _long_prompt()
    ref = comp.reference(prompts, {"max_prompt_tokens": 32, "new_tokens": 6})
    eager = comp.eager_runner()

    def flipped(when):  # the logits negated (another argmax) at the positions ``when`` names
        def run(feed):
            out = eager(feed)
            return [-out[0], *out[1:]] if when(_position(feed)) else out
        return run
    assert comp.trace(flipped(lambda p: p < START), ref, None)[0].generated == ref[0].generated  # never called there
    assert comp.trace(flipped(lambda p: p >= ref[0].n_prompt - 1), ref, None)[0].generated[0] != ref[0].generated[0]
