"""MiniCPM-o flow: the streaming encoder and the streaming DiT/CFG Euler loop equal their whole-utterance decode in
fp64 at the fp32 floor, with upstream's cache trimming and noise slicing reproduced; same noise in, same mel out."""
import copy

import numpy as np
import pytest
import torch

from omni_export.families.minicpmo.config import PRESETS
from omni_export.families.minicpmo.dit import timestep_freq
from omni_export.families.minicpmo.flow_host import FlowHost, euler_steps, schedule, t_span
from omni_export.families.minicpmo.graphs import dit_step, eager, encoder_chunk
from omni_export.families.minicpmo.model import MiniCPMOSpeech, init_random
from omni_export.parity.metrics import snr_db

CFG = PRESETS["tiny"]
P = 20                       # prompt mel frames (10 prompt tokens)
FLOOR_DB = 110.0             # fp32 against fp64 on these graphs measured 127-134 dB; 110 leaves margin, no more


@pytest.fixture(scope="module")
def setup():
    m = init_random(MiniCPMOSpeech(CFG), 0).eval()
    host = FlowHost(m.flow, CFG, P)
    rng = np.random.default_rng(0)
    prompt, tokens = rng.integers(0, 6561, P // 2), rng.integers(0, 6561, 25 * 4 + 7)   # 5 chunks, last short
    chunks = schedule(prompt, tokens, CFG.chunk_tokens)
    enc = {S: eager(encoder_chunk(m, S, host.cap1)) for S in (P // 2, CFG.chunk_tokens)}
    mus, seen = host.encode_stream(enc, chunks)
    full = host.encode_full(chunks, seen, copy.deepcopy(m.flow).double())
    return m, host, chunks, mus, seen, full


def test_chunk_schedule_is_upstreams():
    prompt, toks = np.arange(10), np.arange(100, 157)
    ch = schedule(prompt, toks, 25)
    assert [len(c.tokens) for c in ch] == [10, 25, 25, 7]
    assert ch[0].look.tolist() == [0, 1, 2]                      # the prompt looks ahead into itself (setup_cache)
    assert ch[1].look.tolist() == [125, 126, 127] and ch[1].n_look == 3
    assert ch[3].n_look == 0                                     # the last chunk: zero rows after embed


def test_encoder_stream_equals_full_decode_with_trimming(setup):
    _, host, chunks, mus, seen, full = setup
    stream = np.concatenate(mus, axis=1)
    assert stream.shape == full.shape == (80, 2 * (P // 2 + 107))
    assert snr_db(full, stream) > FLOOR_DB
    # caches grew by one chunk each, then upstream's trim held them at prompt + 100 mel frames (P/2 + 50 tokens)
    assert [len(s2) for _, s2 in seen] == [0, 20, 70, 120, 120, 120]
    assert [len(s1) for s1, _ in seen] == [0, 10, 35, 60, 60, 60]
    assert [s for _, s in seen] == _upstream_conformer_ids([len(c.tokens) for c in chunks])


def _upstream_conformer_ids(sizes):
    """Frame ids through upstream's own tensor ops: ``forward_chunk`` packs [token cache x2, mel cache] old-first
    and ``Token2wav._trim_conformer_cache`` slices them (its expressions, on id tensors)."""
    att, seen, t0 = None, [], 0
    for n in sizes:
        seen.append([] if att is None else att[-1, 0, 0, :, 0].long().tolist())
        tok = torch.arange(t0, t0 + n, dtype=torch.float64)[None, None, None, :, None]
        mel = torch.arange(2 * t0, 2 * (t0 + n), dtype=torch.float64)[None, None, None, :, None]
        c1 = tok if att is None else torch.cat([att[:1, :, :, : att.shape[3] // 2], tok], dim=3)
        c2 = mel if att is None else torch.cat([att[1:], mel], dim=3)
        att = torch.cat([c1.repeat(1, 1, 1, 2, 1), c2], dim=0)
        if att.shape[3] > P + 100:
            tc = att[:1, :, :, : att.shape[3] // 2]
            tc = torch.cat([tc[:, :, :, : P // 2], tc[:, :, :, tc.shape[3] - 50:]], dim=3)
            mc = torch.cat([att[1:, :, :, :P], att[1:, :, :, att.shape[3] - 100:]], dim=3)
            att = torch.cat([tc.repeat(1, 1, 1, 2, 1), mc], dim=0)
        t0 += n
    return seen


def _upstream_estimator_ids(sizes):
    """Frame ids through upstream's ops: the DiT's ``forward_chunk`` concatenates [new, cache] and
    ``Token2wav._trim_estimator_cache`` keeps ``att[..., :P]`` and ``att[..., -100:]``."""
    att, seen, f0 = None, [], 0
    for n in sizes:
        seen.append([] if att is None else att[0, 0, 0, 0, :].long().tolist())
        new = torch.arange(f0, f0 + n, dtype=torch.float64)[None, None, None, None, :]
        att = new if att is None else torch.cat([new, att], dim=4)
        if att.shape[4] > P + 100:
            att = torch.cat([att[:, :, :, :, :P], att[:, :, :, :, -100:]], dim=4)
        f0 += n
    return seen


def test_trimmed_positions_are_list_indices(setup):
    """Without trimming, the stream would see different relative positions: the reproduction matters."""
    m, host, chunks, mus, seen, full = setup
    untrimmed = FlowHost(m.flow, CFG, P)
    untrimmed.trim_encoder = lambda a, b: (a, b)
    untrimmed.cap1, untrimmed.cap2 = 200, 400
    enc = {S: eager(encoder_chunk(m, S, 200)) for S in (P // 2, CFG.chunk_tokens)}
    other, _ = untrimmed.encode_stream(enc, chunks)
    assert snr_db(full[:, :P + 100], np.concatenate(other, axis=1)[:, :P + 100]) > FLOOR_DB   # before any trim
    assert snr_db(full, np.concatenate(other, axis=1)) < 60.0                               # after: differs


def test_euler_schedule_is_cosine():
    ts = t_span(10)
    assert ts[0] == 0.0 and abs(ts[-1] - 1.0) < 1e-15 and np.all(np.diff(ts) > 0)
    steps = euler_steps(10)
    assert len(steps) == 10 and abs(sum(dt for _, dt in steps) - 1.0) < 1e-12
    assert timestep_freq(np.array([0.0]), 8)[0].tolist() == [1, 1, 1, 1, 0, 0, 0, 0]


def _dit_run(m, host, mus, seed):
    rng = np.random.default_rng(seed)
    spk, pmel = rng.standard_normal(80).astype(np.float32), rng.standard_normal((80, P)).astype(np.float32)
    noise = rng.standard_normal((80, 400)).astype(np.float32)
    runs = {F: eager(dit_step(m, F, host.cap2)) for F in (P, CFG.chunk_frames)}
    mels, seen = host.dit_stream(runs, mus, spk, pmel, noise)
    return mels, seen, (spk, pmel, noise)


def test_dit_stream_equals_full_ode_with_trimming(setup):
    m, host, chunks, mus, _, full = setup
    mus64 = [full[:, :P]] + [full[:, P + 50 * i: P + 50 * (i + 1)] for i in range(len(mus) - 1)]
    mels, seen, (spk, pmel, noise) = _dit_run(m, host, [x.astype(np.float32) for x in mus64], 1)
    assert [len(s) for s in seen] == [0, 20, 70, 120, 120, 120]
    # upstream's estimator cache is ordered [newest chunk, ..., oldest]: att[:P] ++ att[-100:] keeps the first P
    # rows of the newest chunk and the oldest 100 frames (the prompt and the first generated ones), not the newest
    assert seen == _upstream_estimator_ids([x.shape[1] for x in mels])
    assert seen[-1][:P] == list(range(P + 150, P + 170)) and seen[-1][-P:] == list(range(P))
    est = copy.deepcopy(m.flow.decoder.estimator).double()
    ref = host.dit_full(est, full, spk, pmel, noise, [x.shape[1] for x in mels], seen)
    stream = np.concatenate(mels, axis=1)
    assert stream.shape == ref.shape == (80, P + 214)
    assert snr_db(ref, stream) > FLOOR_DB


def test_same_noise_same_mel_and_noise_slices_repeat_after_trim(setup):
    m, host, _, mus, _, _ = setup
    a, seen, _ = _dit_run(m, host, mus, 2)
    b, _, _ = _dit_run(m, host, mus, 2)
    c, _, _ = _dit_run(m, host, mus, 3)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert snr_db(np.concatenate(a, 1), np.concatenate(c, 1)) < 20.0
    # upstream's noise offset is the trimmed cache length: chunks 4 and 5 draw the same slice
    assert [len(s) for s in seen][3:] == [P + 100] * 3


def test_mish_is_written_without_the_mish_op():
    """The QNN HTP EP refuses ONNX Mish; the DiT's form is the same function (and never exponentiates x > 0)."""
    from omni_export.families.minicpmo.dit import Mish

    x = torch.linspace(-60, 60, 10001, dtype=torch.float64)
    assert torch.allclose(Mish()(x), torch.nn.functional.mish(x), atol=1e-13)
    assert torch.isfinite(Mish()(x.half())).all()
