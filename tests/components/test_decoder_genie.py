"""The Genie-form decode step and prefill (``components.decoder_genie``): fed as Genie feeds them (one linear cache,
mask 0 / -1000, cos/sin of rope-theta at half width, K transposed), they compute what the model computes, past the
sliding window too; and run under the decode step's host loop they give the decode step's outputs."""
import numpy as np
import pytest
import torch

from omni_export.components.decoder_genie import GENIE_MASK, GenieHost, GenieStep, genie_spec, rope_plan, step_adapter
from omni_export.components.decoder_lm import DecodeStepComponent, reference_logits
from omni_export.errors import UnsupportedError
from omni_export.blocks.layers import FULL, SLIDING
from omni_export.parity.metrics import log_softmax

TOKENS = [int(t) for t in np.random.RandomState(1).randint(3, 4000, 41)]  # > 2 windows of 16


def runner(module):
    @torch.no_grad()
    def run(feed):
        args = (torch.from_numpy(np.ascontiguousarray(feed[n])) for n in module.input_names)
        return [o.numpy() for o in module(*args)]
    return module.input_names, run


def variants(lm, context, rows=8):
    return {ar: runner(GenieStep(lm, context, ar).eval()) for ar in sorted({1, rows})}


def test_spark_rope_plan_uses_genies_table_where_it_can(tiny_spark):
    theta, plan = rope_plan(tiny_spark.config)
    assert theta == 10000 and plan == {SLIDING: True, FULL: False}  # full layers: base 5e6 over 16 of 64 dims


@pytest.mark.parametrize("rows", [1, 8])
def test_genie_host_matches_the_whole_sequence_reference_past_the_window(tiny_spark, rows):
    """Prompt through AR-N (or AR-1), then greedy AR-1: every generated position's logits equal the recompute-everything
    reference of the same tokens (41 + 12 positions, window 16)."""
    cfg = tiny_spark.config
    host = GenieHost(cfg, 64, rope_plan(cfg)[0])
    gen, logits = host.generate(variants(tiny_spark.module, 64, rows), TOKENS, 12)
    ref = reference_logits(tiny_spark.module, TOKENS + gen[:-1])[len(TOKENS) - 1:]
    assert len(gen) == 12 and logits.shape == ref.shape
    assert np.abs(log_softmax(logits) - log_softmax(ref)).max() < 1e-4
    assert [int(t) for t in ref.argmax(-1)] == gen


def test_adapter_gives_the_decode_steps_outputs(tiny_spark):
    """The Genie AR-1 graph under the decode step's own host loop (caches, ring, masks) returns its outputs."""
    dec = DecodeStepComponent(tiny_spark, 64)
    names, run = runner(GenieStep(tiny_spark.module, 64, 1).eval())
    want, _ = dec.run_tokens(dec.eager_runner(), TOKENS)
    got, _ = dec.run_tokens(step_adapter(dec, names, run), TOKENS)
    for k in want:
        assert got[k].shape == want[k].shape, k
        assert np.abs(got[k] - want[k]).max() < 1e-4, k


def test_unwritten_slots_never_reach_the_arithmetic(tiny_spark):
    """Genie leaves garbage in slots not yet written (measured): huge values there change nothing."""
    m = GenieStep(tiny_spark.module, 32, 1).eval()
    cfg = tiny_spark.config
    host = GenieHost(cfg, 32, 10000)
    keys = [np.random.RandomState(i).randn(cfg.num_key_value_heads, 5, cfg.head_dim).astype(np.float32)
            for i in range(cfg.num_hidden_layers)]
    f = host.feed(m.input_names, 1, [7], 5, keys, keys)
    names, run = runner(m)
    clean = run(f)
    for n in f:
        if n.startswith("past_"):
            f[n] = f[n].copy()
            if "key" in n:
                f[n][..., 5:] = 1.3e5
            else:
                f[n][:, :, 5:] = np.inf
    dirty = run(f)
    for a, b in zip(clean, dirty):
        assert np.array_equal(a, b)


def test_specs_follow_genies_contract(tiny_spark):
    cfg = tiny_spark.config
    m = GenieStep(tiny_spark.module, 128, 8)
    shapes = {n: genie_spec(cfg, 128, 8, n).shape for n in m.input_names + m.output_names}
    assert shapes["input_ids"] == (1, 8) and shapes["attention_mask"] == (1, 1, 8, 128)
    assert shapes["position_ids_cos"] == (1, 1, 8, 32)
    assert shapes["past_key_0_in"] == (2, 1, 64, 120) and shapes["past_value_0_in"] == (2, 1, 120, 64)
    assert shapes["past_key_3_out"] == (2, 1, 64, 8) and shapes["past_value_3_out"] == (2, 1, 8, 64)
    assert shapes["logits"] == (1, 8, cfg.vocab_size)


def test_a_rope_genie_cannot_compute_anywhere_is_refused(tiny_spark):
    import dataclasses
    cfg = dataclasses.replace(tiny_spark.config, partial_rotary_factor_sliding=0.5)  # no layer type rotates all dims
    with pytest.raises(UnsupportedError, match="genie: no layer type"):
        rope_plan(cfg)


def test_mask_fill_below_the_projects_range_means_the_same(tiny_spark):
    """Genie's -1000 and any fill at or below -100 give the same outputs (the graph floors the mask at -100)."""
    cfg = tiny_spark.config
    names, run = runner(GenieStep(tiny_spark.module, 64, 1).eval())
    outs = []
    for fill in (GENIE_MASK, -100.0, -3.0e4):
        host = GenieHost(cfg, 64, 10000, mask_fill=fill)
        gen, logits = host.generate({1: (names, run)}, TOKENS[:20], 4)
        outs.append(logits)
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])


def test_calibration_feeds_are_the_decode_steps_samples_as_genie_feeds_them(tiny_spark):
    """Each decode-step calibration sample, re-keyed to Genie's inputs (and, for a later part, the fp32 hidden state of
    the parts before it), makes the Genie-form graphs compute the decode step's outputs for that sample."""
    dec = DecodeStepComponent(tiny_spark, 64, parts=2)
    samples = [{k: v.copy() for k, v in f.items()} for f, _, _ in dec.steps(dec.eager_runner(), TOKENS[:20])][3::5]
    form = dec.genie()
    graphs = form.graphs(1, "token_ar1_cl64")
    want = [dec.eager_runner()(f) for f in samples]
    feeds = {g.name: list(form.calibration_feeds(samples, graphs, g.name)) for g in graphs}
    assert [len(v) for v in feeds.values()] == [len(samples)] * 2
    assert set(feeds[graphs[1].name][0]) == {s.name for s in graphs[1].inputs}  # hidden_2 included
    for j, w in enumerate(want):
        for g in graphs:
            names, run = runner(g.module)
            got = dict(zip([s.name for s in g.outputs], run(feeds[g.name][j])))
            if g is graphs[-1]:
                assert np.abs(got["logits"] - w[0]).max() < 1e-4
            for i in range(g.module.lo, g.module.hi):  # the new K/V rows, Genie's layout
                assert np.abs(got[f"past_key_{i}_out"].transpose(1, 0, 3, 2) - w[1 + 2 * i]).max() < 1e-4
                assert np.abs(got[f"past_value_{i}_out"].transpose(1, 0, 2, 3) - w[2 + 2 * i]).max() < 1e-4
        # the first part's hidden output is the second part's calibration input
        h = dict(zip([s.name for s in graphs[0].outputs], runner(graphs[0].module)[1](feeds[graphs[0].name][j])))
        assert np.array_equal(h["hidden_2"], feeds[graphs[1].name][j]["hidden_2"])
