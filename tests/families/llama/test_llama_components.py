"""The shared decode step and prefill on the llama family: options derived from the model, prefill == decode loop."""
import dataclasses

import numpy as np
import torch
import pytest

from omni_export.families import build_model
from omni_export.families.llama import PRESETS
from omni_export.families.llama.components import prefill_rows


@pytest.fixture(scope="module")
def tiny():
    return build_model("llama", "tiny", seed=0)


def test_prefill_rows_fit_the_model_and_context():
    assert [prefill_rows(PRESETS["tiny"], c) for c in (4, 32, 128, 256, 1024)] == [2, 16, 64, 128, 128]

    @dataclasses.dataclass
    class Windowed:  # a model with sliding layers: a chunk must fit the ring of sliding_window - 1 rows
        sliding_window: int = 8
        layer_types: tuple = ("sliding_attention", "full_attention")
    assert prefill_rows(Windowed(), 128) == 7


def test_decode_loop_matches_full_sequence(tiny):
    comp = tiny.family.components["decode_step"](tiny, context=48)
    assert tiny.tokenizer.name == "bytes+3" and comp.describe()["parts"] == [[0, 4]]
    ids = tiny.tokenizer.encode("llama decode loop against the full sequence")
    outs, _ = comp.run_tokens(comp.eager_runner(), ids)
    full = tiny.module(torch.tensor([ids]))[0].numpy()
    err = np.abs(outs["logits"][:, 0] - full).max() / np.abs(full).max()
    assert err < 2e-6, err


def test_prefill_matches_the_decode_loop_with_a_partial_chunk(tiny):
    dec = tiny.family.components["decode_step"](tiny, context=32)
    pre = tiny.family.components["prefill"](tiny, context=32)
    assert pre.rows == 16 and pre.prompt_tokens == 24  # derived: context / 2 rows, a full and a partial chunk
    ids = tiny.tokenizer.encode("a prompt of more than sixteen bytes")[:24]
    feeds = [f for f, _, _ in pre.chunks(pre.eager_runner(), ids)]
    assert len(feeds) == 2 and np.array_equal(feeds[1]["embeds"][0, 8:], np.repeat(pre.embedding[ids[-1]][None], 8, 0))
    got = pre.prefill(pre.eager_runner(), ids)
    ref, _ = dec.run_tokens(dec.eager_runner(), ids)
    for name in ("logits", "k_new_3", "v_new_0"):
        err = np.abs(got[name] - ref[name]).max() / np.abs(ref[name]).max()
        assert err < 2e-6, (name, err)
