"""MiniCPM-o 4.5 speech output against the official modules: the TTS head, the flow encoder, the DiT estimator,
the CFM stream and HiFT, each with the same seeded random weights loaded into ours through ``checkpoint.split_state``.

The official modules are built from their own sources, outside the project (not a dependency):
- ``--official-src``: the ``src`` directory of the ``minicpmo-utils`` 1.0.5 sdist (the ``stepaudio2`` package: flow
  ``CausalMaskedDiffWithXvec`` with ``UpsampleConformerEncoderV2`` + ``CausalConditionalCFM``/``DiT``, and the
  original ``HiFTGenerator``). Its ``__init__`` (``Token2wav``: CUDA, s3tokenizer, torchaudio, hyperpyyaml) is
  skipped: the package is registered bare and its submodules imported directly.
- ``--demo-file``: ``MiniCPMO45/modeling_minicpmo.py`` of ``OpenBMB/minicpm-o-4_5-pytorch-simple-demo``, with its
  ``configuration_minicpmo.py`` beside it. Its sibling modules ``modeling_navit_siglip``, ``processing_minicpmo``
  and ``utils`` (vision, processor, streaming helpers: nothing ``MiniCPMTTS`` computes with) are stubs.
- ``--site``: an extra import directory with what the official code needs and the project's venv lacks
  (transformers 4.51.0 with a huggingface_hub < 1.0 and tokenizers 0.21, einops 0.8.1).

Dimensions: the ``tiny`` preset where the official classes take them; two fields they hard-code are the real ones
on both sides: the TTS head's unused ``model.embed_tokens`` (transformers' LlamaConfig default 32000 rows) and the
DiT timestep sinusoid (256). The official DiT/CFM preallocated cache buffers (sized for 16 x 512-wide blocks) are
resized to the tiny dims: scratch memory, not parameters. Everything runs in fp32 on both sides; where the official
code draws random numbers (the NSF noise; the CFM's ``rand_noise`` table) ours gets the same numbers.

The encoder stream is compared under two hosts: ``Token2wav.stream`` of minicpmo-utils 1.0.7 (what ``flow_host``
reproduces: the prompt's first 3 tokens as its look-ahead, token-rate caches trimmed to [first P/2, last 50]) and
of 1.0.5 (three silence tokens as the prompt's look-ahead; the packed cache, token-rate rows tiled x2, cut along the
mel-rate axis, so the token-rate layers read its first half). The flow modules are the same in both versions.

    python benchmarks/minicpmo_official_compare.py --official-src SRC --demo-file MiniCPMO45/modeling_minicpmo.py \
        --site SITE --out benchmarks/results/minicpmo_official_compare.json
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import importlib.util
import io
import math
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

SEED = 0
PROMPT_FRAMES = 20       # the seeded voice prompt of the parity host (vocoder.PROMPT_FRAMES): 10 tokens, 20 frames
STREAM_CHUNKS = 5        # chunks of 25 tokens after the prompt: the caches pass prompt + 100 frames at the 3rd
HIFT_FRAMES = 40


class Missing(Exception):
    pass


# -- loading the official sources -----------------------------------------------------------------------------------

def _bare_package(name: str, path: Path):
    mod = types.ModuleType(name)
    mod.__path__ = [str(path)]
    sys.modules[name] = mod
    return mod


def _stub_module(name: str):
    """A module whose every public attribute is an inert class (the demo's vision / processor / streaming helpers)."""
    mod = types.ModuleType(name)

    def getattr_(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        cls = type(attr, (), {"__init__": lambda self, *a, **k: None})
        setattr(mod, attr, cls)
        return cls
    mod.__getattr__ = getattr_
    sys.modules[name] = mod
    return mod


def _load_file(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def load_official(src: Path, demo: Path, site: Path | None):
    root = src / "stepaudio2"
    need = [root / "cosyvoice2/flow/flow.py", root / "cosyvoice2/flow/flow_matching.py",
            root / "cosyvoice2/flow/decoder_dit.py", root / "cosyvoice2/transformer/upsample_encoder_v2.py",
            root / "flashcosyvoice/modules/hifigan.py", demo, demo.parent / "configuration_minicpmo.py"]
    missing = [p.name for p in need if not p.is_file()]
    if missing:
        raise Missing(f"official sources not found (missing {', '.join(missing)}): give --official-src (the "
                      f"minicpmo-utils 1.0.5 src directory) and --demo-file (MiniCPMO45/modeling_minicpmo.py)")
    if site is not None:
        sys.path.insert(0, str(site))
    sys.path.insert(0, str(src))
    _bare_package("stepaudio2", root)                      # skips token2wav (CUDA / s3tokenizer / torchaudio)
    try:
        ns = types.SimpleNamespace(
            flow=importlib.import_module("stepaudio2.cosyvoice2.flow.flow"),
            cfm=importlib.import_module("stepaudio2.cosyvoice2.flow.flow_matching"),
            dit=importlib.import_module("stepaudio2.cosyvoice2.flow.decoder_dit"),
            enc=importlib.import_module("stepaudio2.cosyvoice2.transformer.upsample_encoder_v2"),
            hift=importlib.import_module("stepaudio2.flashcosyvoice.modules.hifigan"),
            hift_layers=importlib.import_module("stepaudio2.flashcosyvoice.modules.hifigan_components.layers"))
        pkg = "minicpmo_demo_official"
        _bare_package(pkg, demo.parent)
        for sib in ("modeling_navit_siglip", "processing_minicpmo", "utils"):
            _stub_module(f"{pkg}.{sib}")
        ns.demo_cfg = _load_file(f"{pkg}.configuration_minicpmo", demo.parent / "configuration_minicpmo.py")
        ns.demo = _load_file(f"{pkg}.modeling_minicpmo", demo)
    except ImportError as e:
        raise Missing(f"official modules do not import ({e}); --site must hold transformers 4.51 and einops")
    import transformers
    ns.versions = {"transformers": transformers.__version__, "torch": torch.__version__,
                   "minicpmo_utils": _pkg_version(src.parent / "PKG-INFO")}
    return ns


def _pkg_version(pkg_info: Path) -> str | None:
    if not pkg_info.is_file():
        return None
    for line in pkg_info.read_text().splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    return None


# -- configuration and random weights -------------------------------------------------------------------------------

def compare_config():
    from omni_export.families.minicpmo.config import PRESETS
    tiny = PRESETS["tiny"]
    return dataclasses.replace(tiny, tts=dataclasses.replace(tiny.tts, vocab_size=32000),
                               dit=dataclasses.replace(tiny.dit, freq_dim=256))


def build_official(off, cfg):
    from omni_export.families.minicpmo.config import AUDIO_BOS, TEXT_EOS
    t, e, d, h = cfg.tts, cfg.encoder, cfg.dit, cfg.hift
    tcfg = off.demo_cfg.MiniCPMTTSConfig(
        llm_dim=cfg.llm_hidden, hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
        num_attention_heads=t.num_attention_heads, num_hidden_layers=t.num_hidden_layers,
        num_key_value_heads=t.num_key_value_heads, max_position_embeddings=t.max_position_embeddings,
        num_audio_tokens=cfg.num_audio_tokens, num_text_tokens=cfg.text_vocab_size, num_vq=1,
        audio_bos_token_id=AUDIO_BOS % cfg.text_vocab_size, text_eos_token_id=TEXT_EOS % cfg.text_vocab_size,
        projector_type="mlp", condition_type="hidden_text_merge", normalize_projected_hidden=True,
        attn_implementation="sdpa")
    tts = off.demo.MiniCPMTTS(tcfg, audio_tokenizer=None)
    encoder = off.enc.UpsampleConformerEncoderV2(
        input_size=e.hidden, output_size=e.hidden, pre_lookahead_len=e.pre_lookahead_len, num_blocks=e.num_blocks,
        num_up_blocks=e.num_up_blocks, up_stride=e.up_stride, up_scale_factor=e.up_stride, attention_heads=e.heads,
        linear_units=e.linear_units)
    est = off.dit.DiT(in_channels=d.in_channels, out_channels=d.out_channels, mlp_ratio=d.mlp_ratio, depth=d.depth,
                      num_heads=d.heads, head_dim=d.head_dim, hidden_size=d.hidden)
    kv = 2 * d.head_dim
    est.att_cache_buffer = torch.zeros(d.depth, 2, d.heads, 1000, kv)
    est.cnn_cache_buffer = torch.zeros(d.depth, 2, 2 * d.hidden, 2)
    cfm = off.cfm.CausalConditionalCFM(est, inference_cfg_rate=cfg.cfg_rate)
    cfm.att_cache_buffer = torch.zeros(16, d.depth, 2, d.heads, 1000, kv)
    cfm.cnn_cache_buffer = torch.zeros(16, d.depth, 2, 2 * d.hidden, 2)
    flow = off.flow.CausalMaskedDiffWithXvec(input_size=e.hidden, output_size=e.mel, spk_embed_dim=e.spk_embed_dim,
                                             vocab_size=e.vocab_size, encoder=encoder, decoder=cfm)
    hift = off.hift.HiFTGenerator(
        in_channels=h.mel, base_channels=h.base_channels, nb_harmonics=h.nb_harmonics, sampling_rate=h.sampling_rate,
        nsf_alpha=h.nsf_alpha, nsf_sigma=h.nsf_sigma, nsf_voiced_threshold=h.nsf_voiced_threshold,
        upsample_rates=list(h.upsample_rates), upsample_kernel_sizes=list(h.upsample_kernel_sizes),
        istft_params={"n_fft": h.n_fft, "hop_len": h.hop_len},
        resblock_kernel_sizes=list(h.resblock_kernel_sizes),
        resblock_dilation_sizes=[list(h.resblock_dilations)] * len(h.resblock_kernel_sizes),
        source_resblock_kernel_sizes=list(h.source_resblock_kernel_sizes),
        source_resblock_dilation_sizes=[list(h.resblock_dilations)] * len(h.source_resblock_kernel_sizes),
        lrelu_slope=h.lrelu_slope, audio_limit=h.audio_limit,
        f0_predictor=off.hift.ConvRNNF0Predictor(in_channels=h.mel, cond_channels=h.f0_channels))
    return tts.eval(), flow.eval(), hift.eval()


WN_G, WN_V = ".parametrizations.weight.original0", ".parametrizations.weight.original1"


def _fan_in(mod, name, shape):
    base = name.split(".parametrizations.")[0] if ".parametrizations." in name else name.rsplit(".", 1)[0]
    if isinstance(mod.get_submodule(base), torch.nn.ConvTranspose1d):
        return shape[0] * shape[2]
    return int(math.prod(shape[1:]))


def randomize(mod, seed: int, scales: dict[str, float]):
    """Seeded weights by the official names: fan-in scaled matrices (weight-norm pairs: v random, g such that W is),
    norms near 1, small biases, N(0,1) embeddings; ``scales``: name substring -> factor on the effective weight."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        params = dict(mod.named_parameters())
        for name, p in params.items():
            leaf = name.rsplit(".", 1)[-1]
            if name.endswith(WN_G):
                continue
            if name.endswith(WN_V):
                p.copy_(torch.randn(p.shape, generator=g))
                gname = name[: -len(WN_V)] + WN_G
                norm = p.reshape(p.shape[0], -1).norm(dim=1).reshape(params[gname].shape)
                fac = 1.0 + 0.1 * torch.randn(norm.shape, generator=g)
                params[gname].copy_(norm / math.sqrt(_fan_in(mod, name, p.shape)) * fac)
            elif p.ndim == 1 and leaf == "weight":
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif leaf == "alpha":
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif leaf == "bias" or leaf.startswith("pos_bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif isinstance(mod.get_submodule(name.rsplit(".", 1)[0]), torch.nn.Embedding):
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(_fan_in(mod, name, p.shape)))
        for key, fac in scales.items():
            for name, p in params.items():
                if key in name and not name.endswith(WN_V) and not name.endswith(".bias"):
                    p.mul_(fac)
    return mod


def official_states(tts, flow, hift) -> dict:
    """The three official checkpoints as files would hold them (written and read back with torch.save/load)."""
    parts = {"tts": {f"tts.{k}": v for k, v in tts.state_dict().items()}, "flow": flow.state_dict(),
             "hift": hift.state_dict()}
    out = {}
    with tempfile.TemporaryDirectory() as d:
        for name, sd in parts.items():
            f = Path(d) / f"{name}.pt"
            torch.save(sd, f)
            out[name] = torch.load(f, map_location="cpu", weights_only=True)
    return out


# -- figures --------------------------------------------------------------------------------------------------------

def figures(name: str, ref, ours, note: str = "") -> dict:
    r = np.asarray(ref.detach().numpy() if torch.is_tensor(ref) else ref, np.float64)
    o = np.asarray(ours.detach().numpy() if torch.is_tensor(ours) else ours, np.float64)
    if r.shape != o.shape:
        raise SystemExit(f"{name}: shapes differ, official {r.shape} vs ours {o.shape}")
    err = float(np.sum((r - o) ** 2))
    sig = float(np.sum(r ** 2))
    snr = None if err == 0 else 10.0 * math.log10(sig / err)
    return {"output": name, "shape": list(r.shape), "snr_db": None if snr is None else round(snr, 2),
            "max_abs_err": float(np.max(np.abs(r - o))), "ref_max_abs": float(np.max(np.abs(r))), "note": note}


# -- TTS head -------------------------------------------------------------------------------------------------------

@torch.no_grad()
def compare_tts(tts_off, ours, cfg, rows):
    from omni_export.families.llama.model import FULL
    from omni_export.blocks.layers import causal_mask, rope_table, run_layers
    rng = np.random.default_rng(SEED + 1)
    n, codes = 8, rng.integers(0, cfg.num_audio_tokens - 1, 6)
    ids = rng.integers(0, cfg.text_vocab_size, n)
    hidden = rng.standard_normal((n, cfg.llm_hidden)).astype(np.float32)

    # official: hidden_text_merge as MiniCPMO builds it, then MiniCPMTTS.generate's prefill + decode calls
    t_ids = torch.from_numpy(ids)
    merged = tts_off.emb_text(t_ids) + F.normalize(tts_off.projector_semantic(torch.from_numpy(hidden)), p=2, dim=-1)
    tail = [tts_off.emb_text(torch.tensor([tts_off.config.text_eos_token_id])),
            tts_off.emb_text(torch.tensor([tts_off.audio_bos_token_id]))]
    cond_off = torch.cat([merged] + tail)
    L = cond_off.shape[0]
    pos = torch.arange(L)[None]
    out = tts_off.model(inputs_embeds=cond_off[None], position_ids=pos, cache_position=pos[0], use_cache=True)
    pkv, hid_off = out.past_key_values, [out.last_hidden_state[0]]
    log_off = [tts_off.head_code[0](out.last_hidden_state)[0]]
    for t, c in enumerate(codes):
        emb = tts_off.emb_code[0](torch.tensor([[int(c)]]))
        p = torch.tensor([[L + t]])
        out = tts_off.model(inputs_embeds=emb, position_ids=p, cache_position=p[0], past_key_values=pkv,
                            use_cache=True)
        pkv = out.past_key_values
        hid_off.append(out.last_hidden_state[0])
        log_off.append(tts_off.head_code[0](out.last_hidden_state)[0])

    # ours: TTSHead.conditions, then the DecoderLM view (prefill rows, then one code per step over the K/V)
    head = ours.tts
    cond = head.conditions(ids, hidden, last_chunk=True)
    lm = head.lm()
    lc = lm.config
    inv = lc.inv_freq(FULL)

    def tables(p):
        return (torch.from_numpy(x)[None, None] for x in rope_table(inv, p))
    cos, sin = tables(np.arange(L))
    empty = torch.zeros(1, lc.num_key_value_heads, 0, lc.head_dim)
    x, caches = run_layers(lm.model.layers, torch.from_numpy(cond)[None], cos, sin, causal_mask(L),
                           [empty] * (2 * lc.num_hidden_layers))
    hs = lm.model.norm(x)
    hid, log = [hs[0]], [lm.lm_head(hs)[0]]
    for t, c in enumerate(codes):
        cos, sin = tables([L + t])
        x, new = run_layers(lm.model.layers, lm.input_embedding()(torch.tensor([[int(c)]])), cos, sin,
                            torch.zeros(1, 1, 1, L + t + 1), caches)
        caches = [torch.cat((a, b), dim=2) for a, b in zip(caches, new)]
        hs = lm.model.norm(x)
        hid.append(hs[0])
        log.append(lm.lm_head(hs)[0])
    rows.append(figures("tts.conditions", cond_off, cond, f"{n} text rows + text_eos + audio_bos"))
    rows.append(figures("tts.prefill_hidden", hid_off[0], hid[0], f"{L} rows, final norm"))
    rows.append(figures("tts.prefill_logits", log_off[0], log[0], "head_code.0 (weight norm folded on ours)"))
    rows.append(figures("tts.decode_hidden", torch.cat(hid_off[1:]), torch.cat(hid[1:]), f"{len(codes)} cached steps"))
    rows.append(figures("tts.decode_logits", torch.cat(log_off[1:]), torch.cat(log[1:]), f"{len(codes)} cached steps"))


# -- flow encoder ---------------------------------------------------------------------------------------------------

def _eager(graph):
    from omni_export.families.minicpmo.graphs import eager
    return eager(graph)


SILENCE = 4218


def _trim_105(att, P: int):
    """minicpmo-utils 1.0.5 ``Token2wav.stream``: the packed cache ([token-rate x2 tiled; mel-rate]) cut along the
    mel-rate axis as [:P] ++ [-100:] (the token-rate layers then read the first half of that)."""
    return torch.cat([att[:, :, :, :P, :], att[:, :, :, -100:, :]], dim=3)


def _trim_107(att, P: int, depth: int):
    """minicpmo-utils 1.0.7 ``Token2wav._trim_conformer_cache``: token-rate layers [first P/2, last 50], mel-rate
    layers [first P, last 100], repacked."""
    tok = att[:depth, :, :, : att.shape[3] // 2]
    tok = torch.cat([tok[:, :, :, : P // 2], tok[:, :, :, tok.shape[3] - 50:]], dim=3)
    mel = torch.cat([att[depth:, :, :, :P], att[depth:, :, :, att.shape[3] - 100:]], dim=3)
    return torch.cat([tok.repeat(1, 1, 1, 2, 1), mel], dim=0)


@torch.no_grad()
def official_encoder_stream(flow_off, chunks, P: int, host: str = "1.0.7"):
    """``setup_cache`` (the prompt chunk) then ``inference_chunk``'s encoder half per chunk, with the conformer cache
    trimming and prompt look-ahead of ``Token2wav`` in minicpmo-utils ``host`` (1.0.5: three silence tokens after
    the prompt, the packed trim; 1.0.7: the prompt's first 3 tokens, the per-scale trim)."""
    enc, mus = flow_off.encoder, []
    cnn = att = None
    for k, ch in enumerate(chunks):
        assert ch.n_look in (0, 3), "a last chunk with 1 or 2 look-ahead tokens is not compared"
        look = ch.look[: ch.n_look]
        if k == 0 and P and host == "1.0.5":
            look = np.full(3, SILENCE)
        toks = np.concatenate([ch.tokens, look])
        xs = flow_off.input_embedding(torch.from_numpy(toks.astype(np.int64))[None])
        h, cnn, att = enc.forward_chunk(xs, last_chunk=ch.n_look == 0, cnn_cache=cnn, att_cache=att)
        mus.append(flow_off.encoder_proj(h).transpose(1, 2)[0])
        if k > 0 and att.shape[3] > P + 100:
            att = _trim_105(att, P) if host == "1.0.5" else _trim_107(att, P, len(enc.encoders))
    return mus


def compare_encoder(flow_off, ours, cfg, rows):
    from omni_export.families.minicpmo.flow_host import FlowHost, schedule
    from omni_export.families.minicpmo.graphs import encoder_chunk
    rng = np.random.default_rng(SEED + 2)
    N, V = cfg.chunk_tokens, cfg.encoder.vocab_size

    # one chunk, no cache (25 + 3 look-ahead tokens -> 50 frames of mu)
    toks = rng.integers(0, V, N + 3)
    host0 = FlowHost(ours.flow, cfg, 0)
    ch = schedule(np.zeros(0, np.int64), toks, N)
    mus, _ = host0.encode_stream({N: _eager(encoder_chunk(ours, N, host0.cap1))}, ch[:1])
    ref = official_encoder_stream(flow_off, ch[:1], 0)
    rows.append(figures("encoder.mu_chunk", ref[0], mus[0], "25+3 tokens, empty caches"))

    # the stream with the parity host's voice prompt (P = 20 frames), the caches trimmed after each chunk
    P = PROMPT_FRAMES
    prompt = rng.integers(0, V, P // 2)
    toks = rng.integers(0, V, STREAM_CHUNKS * N)
    chunks = schedule(prompt, toks, N)
    host = FlowHost(ours.flow, cfg, P)
    runs = {P // 2: _eager(encoder_chunk(ours, P // 2, host.cap1)), N: _eager(encoder_chunk(ours, N, host.cap1))}
    mus, seen = host.encode_stream(runs, chunks)
    ref = official_encoder_stream(flow_off, chunks, P, "1.0.7")
    for k, (r, o) in enumerate(zip(ref, mus)):
        what = "prompt chunk, look-ahead prompt[:3]" if k == 0 else \
            f"chunk {k}: caches seen {len(seen[k][0])} token / {len(seen[k][1])} mel rows"
        rows.append(figures(f"encoder.stream_mu[{k}]", r, o, f"1.0.7 host; {what}"))
    ref105 = official_encoder_stream(flow_off, chunks, P, "1.0.5")
    for k, (r, o) in enumerate(zip(ref105, mus)):
        what = "prompt chunk, look-ahead 3 x silence 4218" if k == 0 else f"chunk {k}"
        rows.append(figures(f"encoder.stream_mu_v105[{k}]", r, o, f"1.0.5 host (packed trim); {what}"))
    return chunks, ref


# -- DiT estimator and the CFM stream --------------------------------------------------------------------------------

@torch.no_grad()
def compare_dit(flow_off, ours, cfg, rows):
    from omni_export.families.minicpmo.dit import timestep_freq
    est_off, est = flow_off.decoder.estimator, ours.flow.decoder.estimator
    d = cfg.dit
    g = torch.Generator().manual_seed(SEED + 3)
    T, C = cfg.chunk_frames, 30
    x, mu, cond = (torch.randn(2, 80, T, generator=g) for _ in range(3))
    spks = torch.randn(2, 80, generator=g)
    t = torch.tensor([0.3, 0.3])
    tf64 = torch.from_numpy(timestep_freq(t.double().numpy(), d.freq_dim)).float()
    tf32 = est_off.t_embedder.timestep_embedding(t * est_off.t_embedder.scale, d.freq_dim)

    # whole-chunk forward (padding mask all valid)
    v_off = est_off.forward(x, torch.ones(2, 1, T), mu, t, spks, cond)
    zero = torch.zeros(T, T)
    v = est.full(x, mu, tf64, spks, cond, zero)
    rows.append(figures("dit.velocity", v_off, v, "DiT.forward, B=2, 50 frames, t=0.3 (ours: fp64 sinusoid)"))
    rows.append(figures("dit.velocity_same_tfreq", v_off, est.full(x, mu, tf32, spks, cond, zero),
                        "same, ours fed the official fp32 sinusoid"))

    # one streaming call over carried caches (forward_chunk twice; ours DiTStep's function on the second)
    xa, mua, ca = (torch.randn(2, 80, C, generator=g) for _ in range(3))
    _, cnn0, att0 = est_off.forward_chunk(xa, mua, t, spks, ca, None, None)
    cnn0, att0 = cnn0.clone(), att0.clone()
    v_off, cnn1, att1 = est_off.forward_chunk(x, mu, t, spks, cond, cnn0, att0)
    mask = torch.zeros(1, 1, 1, T + C)
    v, conv_new, kv_new = est.run(x, mu, tf32, spks, cond, mask, cnn0, att0)
    rows.append(figures("dit.step_velocity", v_off, v, f"forward_chunk over a {C}-frame cache"))
    rows.append(figures("dit.step_conv_cache", cnn1, conv_new, "new conv caches"))
    rows.append(figures("dit.step_kv_new", att1[:, :, :, :T], kv_new, "new K/V rows ([new, cache] order)"))


@torch.no_grad()
def compare_cfm_stream(flow_off, ours, cfg, rows, mus_off):
    """The Euler/CFG loop chunk by chunk with the estimator caches and trimming, both sides fed the official mu."""
    from omni_export.families.minicpmo.flow_host import FlowHost
    from omni_export.families.minicpmo.graphs import dit_step
    P, N = PROMPT_FRAMES, cfg.chunk_frames
    rng = np.random.default_rng(SEED + 4)
    prompt_mel = (0.5 * rng.standard_normal((80, P))).astype(np.float32)
    xvec = rng.standard_normal((1, cfg.encoder.spk_embed_dim)).astype(np.float32)
    noise = rng.standard_normal((80, P + cfg.history_frames + 2 * N)).astype(np.float32)
    cfm = flow_off.decoder
    cfm.rand_noise = torch.from_numpy(noise)[None]
    spk_off = flow_off.spk_embed_affine_layer(F.normalize(torch.from_numpy(xvec), dim=1))
    mels_off, cnn, att = [], None, None
    for k, mu in enumerate(mus_off):
        cond = torch.from_numpy(prompt_mel)[None] if k == 0 else torch.zeros_like(mu)[None]
        mel, cnn, att = cfm.forward_chunk(mu[None], spk_off, cond, n_timesteps=cfg.n_timesteps, temperature=1.0,
                                          cnn_cache=cnn, att_cache=att)
        cnn, att = cnn.clone(), att.clone()       # the buffers are reused by the next call
        if k > 0 and att.shape[4] > P + 100:
            att = torch.cat([att[:, :, :, :, :P], att[:, :, :, :, -100:]], dim=4)
        mels_off.append(mel[0])
    host = FlowHost(ours.flow, cfg, P)
    spk = ours.flow.spk(torch.from_numpy(xvec))[0].numpy()
    runs = {P: _eager(dit_step(ours, P, host.cap2)), N: _eager(dit_step(ours, N, host.cap2))}
    mels, seen = host.dit_stream(runs, [m.numpy() for m in mus_off], spk, prompt_mel, noise)
    rows.append(figures("flow.spk", spk_off[0], spk, "spk_embed_affine_layer(L2norm(x-vector))"))
    for k, (r, o) in enumerate(zip(mels_off, mels)):
        rows.append(figures(f"cfm.stream_mel[{k}]", r, o, f"10 Euler steps x CFG; estimator cache {len(seen[k])} rows"))


# -- HiFT -----------------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def fixed_randn_like(table: torch.Tensor):
    """``torch.randn_like`` returns ``table`` (cast) for its shape and zeros otherwise (the unused NSF noise branch)."""
    orig = torch.randn_like

    def fake(x, *a, **k):
        if tuple(x.shape) == tuple(table.shape):
            return table.to(x.dtype)
        return torch.zeros_like(x)
    torch.randn_like = fake
    try:
        yield
    finally:
        torch.randn_like = orig


@torch.no_grad()
def compare_hift(hift_off, ours, cfg, rows):
    import copy

    from omni_export.families.minicpmo.hift import nsf_harmonics
    c = cfg.hift
    L = HIFT_FRAMES * c.samples_per_frame
    g = torch.Generator().manual_seed(SEED + 5)
    mel = torch.randn(1, c.mel, HIFT_FRAMES, generator=g)
    table = torch.randn(1, L, c.nb_harmonics + 1, generator=g, dtype=torch.float64)
    got = {}
    hook = hift_off.m_source.l_sin_gen.register_forward_hook(lambda m, i, o: got.__setitem__("sines", o[0]))
    torch.manual_seed(SEED)                       # the random initial phases (they never reach the output)
    with fixed_randn_like(table):
        audio_off, _ = hift_off(speech_feat=mel)
    hook.remove()
    sines = got["sines"]                          # [1, L, 9]: sines * uv + noise
    f0_off = hift_off.f0_predictor(mel)
    h = ours.hift
    f0 = h.f0_predictor(mel)
    rows.append(figures("hift.f0", f0_off, f0, f"{HIFT_FRAMES} frames (Hz)"))
    noise = table[0].T.numpy()
    har = nsf_harmonics(f0_off[0].double().numpy(), c, noise)
    rows.append(figures("hift.nsf_source", sines[0].T, har, "official fp32 SineGen2 vs ours fp64 host, same f0 and "
                                                             "noise"))
    audio_dec = h.decode(mel, sines.transpose(1, 2).float())
    rows.append(figures("hift.audio_decode", audio_off, audio_dec, "ours fed the official source rows"))
    har_own = nsf_harmonics(f0[0].double().numpy(), c, noise)
    audio = h.decode(mel, torch.from_numpy(har_own).float()[None])
    rows.append(figures("hift.audio", audio_off, audio, "end to end: ours f0 (fp32) -> host NSF (fp64) -> decode"))

    # diagnostics in fp64, with ours' (fp32-folded) weights on the official side too: the fp32 rows above are the
    # cumulative phase amplifying fp32 rounding (of the f0, of the official fp32 source, of the folded weights)
    off64 = copy.deepcopy(hift_off).double()
    for mod in off64.modules():
        if torch.nn.utils.parametrize.is_parametrized(mod, "weight"):
            torch.nn.utils.parametrize.remove_parametrizations(mod, "weight", leave_parametrized=True)
    off64.load_state_dict({k: v.double() for k, v in h.state_dict().items()}, strict=True)
    off64.stft_window = off64.stft_window.double()
    torch.manual_seed(SEED)
    with fixed_randn_like(table):
        a64, _ = off64(speech_feat=mel.double())
    h64 = copy.deepcopy(h).double()
    f64 = h64.f0_predictor(mel.double())
    a_ours64 = h64.decode(mel.double(), torch.from_numpy(nsf_harmonics(f64[0].numpy(), c, noise))[None])
    rows.append(figures("hift.audio_fp64", a64, a_ours64, "diagnostic: both sides fp64, identical weights"))
    rows.append(figures("hift.audio_fp32_floor_official", a64, audio_off, "diagnostic: official fp32 vs fp64"))
    rows.append(figures("hift.audio_fp32_floor_ours", a64, audio, "diagnostic: ours fp32 vs official fp64"))


# -- main -----------------------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--official-src", type=Path, required=True, help="minicpmo-utils 1.0.5 src directory")
    ap.add_argument("--demo-file", type=Path, required=True, help="MiniCPMO45/modeling_minicpmo.py")
    ap.add_argument("--site", type=Path, default=None, help="extra import dir (transformers 4.51, einops)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/minicpmo_official_compare.json"))
    a = ap.parse_args(argv)
    try:
        off = load_official(a.official_src, a.demo_file, a.site)
    except Missing as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from omni_export.artifacts.atomic import write_json_atomic
    from omni_export.families.minicpmo.checkpoint import split_state
    from omni_export.families.minicpmo.model import MiniCPMOSpeech

    torch.manual_seed(SEED)
    cfg = compare_config()
    tts_off, flow_off, hift_off = build_official(off, cfg)
    randomize(tts_off, SEED + 10, {})
    randomize(flow_off, SEED + 11, {"adaLN_modulation": 0.3})
    randomize(hift_off, SEED + 12, {"conv_post": 0.1, "f0_predictor.classifier.weight": 300.0})
    ours = MiniCPMOSpeech(cfg).eval()
    state = split_state(ours, official_states(tts_off, flow_off, hift_off))
    ours.load_state_dict(state, strict=True)

    rows: list[dict] = []
    with contextlib.redirect_stdout(io.StringIO()):
        compare_tts(tts_off, ours, cfg, rows)
        _, mus_off = compare_encoder(flow_off, ours, cfg, rows)
        compare_dit(flow_off, ours, cfg, rows)
        compare_cfm_stream(flow_off, ours, cfg, rows, mus_off)
        compare_hift(hift_off, ours, cfg, rows)

    w = max(len(r["output"]) for r in rows)
    print(f"{'output':<{w}}  {'SNR dB':>8}  {'max |err|':>10}  {'max |ref|':>9}  note")
    for r in rows:
        snr = "exact" if r["snr_db"] is None else f"{r['snr_db']:.1f}"
        print(f"{r['output']:<{w}}  {snr:>8}  {r['max_abs_err']:>10.3g}  {r['ref_max_abs']:>9.3g}  {r['note']}")
    result = {
        "what": "MiniCPM-o 4.5 speech output: official modules (MiniCPMTTS; stepaudio2 flow, DiT, HiFT) vs ours, "
                "same seeded weights loaded through checkpoint.split_state, fp32 both sides",
        "official": {"tts": "OpenBMB/minicpm-o-4_5-pytorch-simple-demo MiniCPMO45/modeling_minicpmo.py MiniCPMTTS",
                     "vocoder": "minicpmo-utils stepaudio2 (cosyvoice2 flow, flashcosyvoice HiFTGenerator)",
                     "stubbed": ["stepaudio2/__init__ (Token2wav)", "demo modeling_navit_siglip",
                                 "demo processing_minicpmo", "demo utils"],
                     "versions": off.versions},
        "config": {"preset": "tiny", "changes": {"tts.vocab_size": 32000, "dit.freq_dim": 256},
                   "prompt_frames": PROMPT_FRAMES, "stream_chunks": STREAM_CHUNKS, "hift_frames": HIFT_FRAMES,
                   "seed": SEED},
        "snr": "10*log10(sum(ref^2)/sum((ref-ours)^2)), ref = official; null = bit-exact",
        "rows": rows,
    }
    write_json_atomic(a.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
