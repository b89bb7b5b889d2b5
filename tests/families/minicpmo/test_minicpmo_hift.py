"""MiniCPM-o HiFT: STFT/iSTFT as convolutions equal torch.stft/istft, the receptive field the stream's context
covers, streaming windows == the full decode in fp64 at the fp32 floor, F0 precision, seeded NSF source."""
import numpy as np
import pytest
import torch

from omni_export.families.minicpmo.config import PRESETS
from omni_export.families.minicpmo.graphs import eager, f0_window, hift_window
from omni_export.families.minicpmo.hift import STFT, hann, nsf_harmonics
from omni_export.families.minicpmo.hift_host import CONTEXT, F0_CONTEXT, HiFTHost
from omni_export.families.minicpmo.model import MiniCPMOSpeech, init_random
from omni_export.parity.metrics import snr_db

CFG = PRESETS["tiny"]


@pytest.fixture(scope="module")
def model():
    return init_random(MiniCPMOSpeech(CFG), 0).eval()


def _mel(n, seed=0):
    return (0.5 * np.random.default_rng(seed).standard_normal((80, n))).astype(np.float32)


def test_conv_stft_and_istft_equal_torch():
    st = STFT(16, 4).double()
    x = torch.randn(1, 1, 1440, dtype=torch.float64)
    ref = torch.stft(x[:, 0], 16, 4, 16, window=torch.from_numpy(hann(16)), return_complex=True)
    got = st.stft(x)
    assert torch.allclose(got[:, :9], ref.real, atol=1e-12) and torch.allclose(got[:, 9:], ref.imag, atol=1e-12)
    re, im = torch.randn(1, 9, 361, dtype=torch.float64), torch.randn(1, 9, 361, dtype=torch.float64)
    ref = torch.istft(torch.complex(re, im), 16, 4, 16, window=torch.from_numpy(hann(16)))
    assert ref.shape == (1, 1440) and torch.allclose(st.istft(re, im), ref, atol=1e-12)


def test_hift_constants_have_no_zero_strides(model):
    """ExecuTorch refuses a constant with a zero stride (a numpy broadcast view of the DFT bases did that)."""
    g = hift_window(model, 100).module
    bad = [n for n, b in g.named_buffers() if 0 in b.stride()]
    assert not bad, bad


def test_receptive_field_fits_the_stream_context(model):
    h = model.hift.double()
    try:
        mel = torch.from_numpy(_mel(80)).double()[None]
        har = 0.1 * torch.randn(1, 9, 80 * 480, dtype=torch.float64)
        with torch.no_grad():
            base = h.decode(mel, har)
            for what in ("mel", "src"):
                m2, h2 = mel.clone(), har.clone()
                if what == "mel":
                    m2[..., 40] += 1.0
                else:
                    h2[..., 40 * 480] += 1.0
                hit = torch.nonzero((h.decode(m2, h2) - base).abs()[0] > 1e-12)[:, 0]
                lo, hi = hit.min().item() // 480, hit.max().item() // 480
                assert 40 - CONTEXT < lo and hi < 40 + CONTEXT, (what, lo, hi)   # measured: frames 26..54
            f0 = h.f0_predictor(mel)
            m2 = mel.clone()
            m2[..., 40] += 1.0
            hit = torch.nonzero((h.f0_predictor(m2) - f0).abs()[0] > 0)[:, 0]
            assert hit.min() == 35 and hit.max() == 45 and F0_CONTEXT >= 5
    finally:
        model.hift.float()


def test_stream_equals_full_decode_and_f0_needs_fp64(model):
    host = HiFTHost(model.hift, CFG, seed=0)
    runs = {"hift": eager(hift_window(model, host.W))}
    mel = _mel(130)
    ref = host.full_decode(mel)
    audio, reads = host.stream(runs, mel)
    assert audio.shape == ref.shape == (130 * 480,) and np.abs(ref).max() < 0.99   # inside the clamp
    assert snr_db(ref, audio) > 110.0                                              # measured 116.8 dB
    assert reads[0] == 141   # the first 50 frames of audio wait for 141 mel frames: exactness of a non-causal HiFT
    # an fp32 F0 graph loses ~50 dB through the NSF cumulative phase (upstream runs F0 in fp64 too)
    audio32, _ = host.stream({**runs, "f0": eager(f0_window(model, host.Wf))}, mel)
    assert snr_db(ref, audio32) < 90.0
    # the shipped recipe's fp32 bar passes the faithful stream and blocks the fp32-F0 one
    from omni_export.recipes import load_recipe

    bar = load_recipe("minicpmo_fp16").thresholds["fp32"][0]
    assert bar.metric == "snr_db" and snr_db(ref, audio32) < bar.min < snr_db(ref, audio)


def test_same_seed_same_source_and_voiced_branch():
    c = CFG.hift
    f0 = np.array([0.0, 5.0, 120.0, 180.0])
    noise = np.random.default_rng(0).standard_normal((9, 4 * 480))
    a, b = nsf_harmonics(f0, c, noise), nsf_harmonics(f0, c, noise)
    assert np.array_equal(a, b) and a.shape == (9, 4 * 480)
    unvoiced, voiced = a[:, :2 * 480], a[:, 2 * 480:]
    assert np.allclose(unvoiced, c.nsf_alpha / 3 * noise[:, :960])      # below 10 Hz: noise at alpha/3 only
    assert np.abs(voiced).max() > 0.09 and np.abs(voiced - c.nsf_sigma * noise[:, 960:]).max() <= c.nsf_alpha + 1e-12
