"""Qwen3-TTS model: exact streaming Code2Wav, checkpoint layout, HTP rewrites, predictor layouts, sampler."""
import numpy as np
import pytest
import torch

from omni_export.families.qwen3_tts.host import TTSHost, schedule
from omni_export.errors import CheckpointError
from omni_export.families.qwen3_tts.forms import snake_square_as_mul
from omni_export.blocks.graph_forms import (Int8HiLo, causal_pad_as_concat, dilated_conv_as_im2col, layer_norm_as_rms,
                                     split_int8_hi_lo, trans_conv_as_polyphase)
from omni_export.families import build_model
from omni_export.families.qwen3_tts.checkpoint import save_checkpoint
from omni_export.families.qwen3_tts.graphs import sample_top_k
from omni_export.parity.metrics import log_mel_distance, snr_db


@pytest.fixture(scope="module")
def tts():
    b = build_model("qwen3_tts", "tiny", seed=0)
    return b, TTSHost(b, context=64)


def _codes(n, seed=0):
    return np.random.RandomState(seed).randint(0, 2048, (n, 16)).astype(np.int64)


def test_streaming_equals_full_decode(tts):
    _, host = tts
    codes = _codes(51)                       # 1 + 25 + 25: crosses the 72-frame window's state hand-over
    full = host.full_decode(codes)
    assert full.shape == (51 * 1920,) and 0.05 < full.std() < 0.6 and np.mean(np.abs(full) >= 1.0) < 0.01
    runs = {n: host.chunk_runner(n) for n in (1, 25)}
    wav, outs = host.stream(runs, codes, schedule(51))
    assert [o[0].shape[-1] // 1920 for o in outs] == [1, 25, 25]
    assert snr_db(full, wav) >= 90.0
    approx = host.left_context_decode(codes, schedule(51), context=5)
    assert snr_db(full, approx) < 60.0   # truncating the left context is only approximate (72 frames: ~27 dB)


def test_rewrites_are_exact_in_fp32(tts):
    b, host = tts
    dec = b.module.speech_tokenizer.decoder
    codes = torch.from_numpy(_codes(6).T[None].copy())
    with torch.no_grad():
        ref = dec(codes).numpy()
        for rw in (snake_square_as_mul, causal_pad_as_concat, trans_conv_as_polyphase, layer_norm_as_rms,
                   dilated_conv_as_im2col):
            assert snr_db(ref, rw(dec)(codes).numpy()) >= 100.0
        split = split_int8_hi_lo(dec, lambda n: n.startswith("decoder."))
        assert snr_db(ref, split(codes).numpy()) >= 100.0
    pairs = [m for m in split.modules() if isinstance(m, Int8HiLo)]
    assert len(pairs) > 10 and all(m.lo.bias is None for m in pairs)
    for m in pairs:   # hi on the quantizer's symmetric int8 grid exactly; lo within half a step of it
        w = m.hi.weight.detach()
        scale = w.abs().amax(dim=tuple(range(1, w.dim())), keepdim=True) / 127.0
        q = w / scale
        assert torch.allclose(q, q.round(), atol=1e-3) and q.abs().max() <= 127.0 + 1e-3
        assert bool((m.lo.weight.detach().abs() <= 0.5 * scale + 1e-7).all())
    dilated = [m for m in dilated_conv_as_im2col(dec).modules() if type(m).__name__ == "DilatedConvIm2col"]
    assert dilated and all(m.d > 1 and m.conv.kernel_size == (1,) for m in dilated)
    assert log_mel_distance(ref, ref) == 0.0 and log_mel_distance(ref, 0.5 * ref) > 5.0


def test_snake_runs_on_rows_in_few_channel_stages_bit_identically(tts):
    """``SnakeBetaMul`` takes the row form where a stage has few channels and a whole number of rows, and computes the
    same fp32 values as the official SnakeBeta there and everywhere else."""
    from omni_export.families.qwen3_tts.forms import FEW, ROW, SnakeBetaMul
    from omni_export.families.qwen3_tts.model import SnakeBeta

    b, _ = tts
    stages = []
    for m in b.module.speech_tokenizer.decoder.modules():
        if isinstance(m, SnakeBeta):
            stages.append(m)
    widths = {m.alpha.numel() for m in stages}
    assert min(widths) < FEW <= max(widths)        # the tiny decoder has both kinds of stage
    torch.manual_seed(0)
    for m in stages:
        c = m.alpha.numel()
        for length in (ROW * 5, ROW * 5 + 1):
            x = 5 * torch.randn(1, c, length)
            rows = SnakeBetaMul(m)
            with torch.no_grad():
                assert torch.equal(rows(x), m(x))
            graph = torch.jit.trace(rows, x).graph if c < FEW and length % ROW == 0 else None
            if graph is not None:                 # the Sin runs on [1, C*L/ROW, ROW]
                sins = [n for n in graph.nodes() if n.kind() == "aten::sin"]
                assert [list(n.output().type().sizes()) for n in sins] == [[1, c * length // ROW, ROW]]


def test_window_and_kv_predictor_agree(tts):
    b, host = tts
    h = np.random.RandomState(1).standard_normal(b.config.talker.hidden_size).astype(np.float32)
    from omni_export.families.qwen3_tts.host import _eager
    step = _eager(host.pred_graph, list(host.pred_feed(host.pred_caches(), h, 0)))
    win = _eager(host.window_graph, ["embeds", "cos", "sin", "mask"])
    outs_s, codes_s = host.pred_frame(step, h, 7)
    outs_w, codes_w = host.window_frame(lambda f: [win(f)[0][:, [int(np.argmax(f["head"]))]]], h, 7)
    assert codes_s == codes_w
    ls = np.concatenate([o[0] for o in outs_s[1:]]).reshape(15, -1)
    lw = np.concatenate([o[0] for o in outs_w]).reshape(15, -1)
    assert snr_db(ls, lw) >= 100.0


def test_sampler_is_reproducible_and_greedy_at_low_u():
    logits = torch.tensor([[[0.0, 5.0, 1.0, 4.0]]])
    assert sample_top_k(logits, torch.tensor([[[0.0]]]), 3, 1.0).item() == 1.0      # u=0: the top code
    assert sample_top_k(logits, torch.tensor([[[0.999]]]), 3, 1.0).item() == 2.0    # u~1: the k-th code
    a = sample_top_k(logits, torch.tensor([[[0.6]]]), 3, 0.9)
    assert a.item() == sample_top_k(logits, torch.tensor([[[0.6]]]), 3, 0.9).item()


def test_checkpoint_roundtrip_official_layout(tts, tmp_path):
    b, _ = tts
    save_checkpoint(b.module, tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "speech_tokenizer" / "model.safetensors").exists()
    loaded = build_model("qwen3_tts", checkpoint=tmp_path / "ckpt")
    assert loaded.config == b.config
    sd = loaded.module.state_dict()
    for k, v in b.module.state_dict().items():
        assert torch.equal(sd[k], v), k
    from safetensors import safe_open
    with safe_open(str(tmp_path / "ckpt" / "model.safetensors"), "pt") as f:
        assert "talker.code_predictor.small_to_mtp_projection.weight" in f.keys()
    with safe_open(str(tmp_path / "ckpt" / "speech_tokenizer" / "model.safetensors"), "pt") as f:
        assert "decoder.quantizer.rvq_first.vq.layers.0._codebook.embedding_sum" in f.keys()
    (tmp_path / "ckpt" / "speech_tokenizer" / "config.json").unlink()
    with pytest.raises(CheckpointError):
        build_model("qwen3_tts", checkpoint=tmp_path / "ckpt")
