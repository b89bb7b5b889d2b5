"""The gemma3 family on seeded weights: config fields (implemented, informational, refused), the cached decode loop
against the full-sequence forward across the sliding window, the exact graph forms, an independent numpy forward,
and a llama.cpp-style GGUF written from the model read back."""
import dataclasses
import math

import numpy as np
import pytest
import torch

from omni_export.errors import CheckpointError
from omni_export.families import build_model
from omni_export.families.gemma3 import PRESETS, Gemma3Config, graph_form
from omni_export.blocks.layers import FULL, SLIDING
from omni_export.parity.metrics import snr_db


@pytest.fixture(scope="module")
def tiny():
    return build_model("gemma3", "tiny", seed=3)


def test_layer_types_rope_and_scales():
    cfg = PRESETS["gemma3-270m"]
    assert cfg.layer_types == tuple(FULL if i in (5, 11, 17) else SLIDING for i in range(18))
    assert np.allclose(cfg.inv_freq(SLIDING)[1], 1e4 ** (-2 / 256)) and np.allclose(cfg.inv_freq(FULL)[1], 1e6 ** (-2 / 256))
    assert cfg.embed_scale == float(np.float32(math.sqrt(640))) and cfg.query_scale == 1.0
    big = Gemma3Config.from_hf({**cfg.to_hf(), "rope_scaling": {"rope_type": "linear", "factor": 8.0}})
    assert np.allclose(big.inv_freq(FULL), cfg.inv_freq(FULL) / 8) and np.array_equal(big.inv_freq(SLIDING), cfg.inv_freq(SLIDING))


def test_config_round_trip_and_hf_fields():
    cfg = PRESETS["gemma3-270m"]
    assert Gemma3Config.from_hf(cfg.to_hf()) == cfg
    hf = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 640,
          "intermediate_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 4, "num_key_value_heads": 1,
          "head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 512, "_sliding_window_pattern": 6,
          "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "rope_theta": 1e6,
          "rope_local_base_freq": 1e4, "rope_scaling": None, "max_position_embeddings": 32768, "vocab_size": 262144,
          "attn_logit_softcapping": None, "final_logit_softcapping": None, "attention_bias": False,
          "use_bidirectional_attention": False, "torch_dtype": "bfloat16", "bos_token_id": 2, "eos_token_id": 1,
          "pad_token_id": 0, "initializer_range": 0.02, "use_cache": True, "attention_dropout": 0.0,
          "layer_types": list(cfg.layer_types)}
    assert Gemma3Config.from_hf(hf) == cfg
    v5 = {k: v for k, v in hf.items() if k not in ("rope_theta", "rope_local_base_freq", "rope_scaling")}
    v5["rope_parameters"] = {FULL: {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                             SLIDING: {"rope_type": "default", "rope_theta": 1e4}}
    assert Gemma3Config.from_hf(v5).rope_scaling.factor == 8.0


@pytest.mark.parametrize("change, needle", [
    ({"model_type": "gemma3", "vision_config": {}}, "multimodal Gemma 3 checkpoint (vision tower)"),
    ({"model_type": "gemma2"}, "is Gemma 2"),
    ({"model_type": "gemma3n_text"}, "is Gemma 3n"),
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping=30.0 is not implemented"),
    ({"hidden_activation": "gelu"}, "hidden_activation=['gelu'] is not implemented"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192}}, "rope_scaling.rope_type='llama3' is not implemented (gemma3: linear"),
    ({"attention_bias": True}, "attention_bias=True is not implemented"),
    ({"sliding_window_pattern": 4}, "sliding_window_pattern=4 disagrees with layer_types"),
    ({"altup_num_inputs": 4}, "altup_num_inputs=4 is not implemented"),
])
def test_unimplemented_fields_are_refused_by_name(change, needle):
    with pytest.raises(CheckpointError, match=needle.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        Gemma3Config.from_hf({**PRESETS["gemma3-270m"].to_hf(), **change})


def test_cached_decode_matches_full_sequence_past_the_window(tiny):
    """40 tokens through the shared decode step's host loop (sliding ring of window - 1 = 15 rows) vs the
    recompute-everything forward with the sliding mask: the ring is right past the window."""
    comp = tiny.family.components["decode_step"](tiny, context=48)
    ids = [int(x) for x in np.random.default_rng(0).integers(3, 4096, 40)]
    outs, _ = comp.run_tokens(comp.eager_runner(), ids)
    full = tiny.module(torch.tensor([ids]))[0].numpy()
    assert snr_db(full, outs["logits"][:, 0]) > 110
    import dataclasses

    from omni_export.families.gemma3 import Gemma3ForCausalLM

    wide = Gemma3ForCausalLM(dataclasses.replace(tiny.config, sliding_window=64))  # same weights, window ignored
    wide.load_state_dict(tiny.module.state_dict())
    assert snr_db(full[20:], wide(torch.tensor([ids]))[0].numpy()[20:]) < 60  # the window matters past 16


def test_graph_forms_compute_the_same_function(tiny):
    ids = torch.tensor([[2, 100, 200, 300, 400, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]])
    ref = tiny.module(ids)
    assert torch.equal(graph_form(tiny.module)(ids), ref)  # folding (1 + w) once in fp32 is the same arithmetic
    scaled = graph_form(tiny.module, residual_scale=2.0**-6, branch_scale=2.0**-3)
    assert snr_db(ref.numpy(), scaled(ids).numpy()) >= 100
    h, hs = tiny.module.hidden_states(ids), scaled.hidden_states(ids)
    assert all(torch.allclose(a * 2.0**-6, b, rtol=1e-5, atol=1e-6) for a, b in zip(h, hs))
    assert scaled.graph_rewrite["residual_scale"] == 2.0**-6 and scaled.graph_rewrite["branch_scale"] == 2.0**-3
    with pytest.raises(ValueError, match="residual_scale must be a power of two, got 0.3"):
        graph_form(tiny.module, residual_scale=0.3)
    comp = tiny.family.components["decode_step"](tiny, context=32, residual_scale=2.0**-6)
    assert comp.describe()["graph_rewrite"]["residual_scale"] == 2.0**-6


def numpy_forward(state: dict, cfg, ids: list[int]) -> np.ndarray:
    """Gemma 3 from its HF state dict in float64 numpy, written from the architecture, not from the module."""
    W = {k: v.double().numpy() for k, v in state.items() if k != "model.embed_tokens.weight"}
    E = state["model.embed_tokens.weight"].numpy()  # fp32: a float64 copy of a 262,144-row table is 1.3 GB
    hd, nh, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads

    def norm(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.rms_norm_eps) * (1.0 + w)

    def rope(x, base, factor):  # x [S, heads, hd], rotate-half
        inv = 1.0 / base ** (np.arange(0, hd, 2) / hd) / factor
        ang = np.arange(x.shape[0])[:, None] * inv[None]
        cos, sin = np.cos(np.concatenate([ang, ang], -1))[:, None], np.sin(np.concatenate([ang, ang], -1))[:, None]
        x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
        return x * cos + np.concatenate([-x2, x1], -1) * sin

    def gelu(x):
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

    S = len(ids)
    x = E[ids].astype(np.float64) * np.float64(np.float32(math.sqrt(cfg.hidden_size)))
    for i, lt in enumerate(cfg.layer_types):
        p = f"model.layers.{i}."
        h = norm(x, W[p + "input_layernorm.weight"])
        q = norm((h @ W[p + "self_attn.q_proj.weight"].T).reshape(S, nh, hd), W[p + "self_attn.q_norm.weight"])
        k = norm((h @ W[p + "self_attn.k_proj.weight"].T).reshape(S, nkv, hd), W[p + "self_attn.k_norm.weight"])
        v = (h @ W[p + "self_attn.v_proj.weight"].T).reshape(S, nkv, hd)
        base = cfg.rope_theta if lt == FULL else cfg.rope_local_base_freq
        factor = cfg.rope_scaling.factor if (lt == FULL and cfg.rope_scaling) else 1.0
        q, k = rope(q, base, factor), rope(k, base, factor)
        k, v = np.repeat(k, nh // nkv, 1), np.repeat(v, nh // nkv, 1)
        sc = np.einsum("shd,thd->hst", q, k) * cfg.query_pre_attn_scalar ** -0.5
        i_, j_ = np.meshgrid(np.arange(S), np.arange(S), indexing="ij")
        ok = (j_ <= i_) & ((j_ > i_ - cfg.sliding_window) if lt == SLIDING else True)
        sc = np.where(ok[None], sc, -np.inf)
        pr = np.exp(sc - sc.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        o = np.einsum("hst,thd->shd", pr, v).reshape(S, nh * hd) @ W[p + "self_attn.o_proj.weight"].T
        x = x + norm(o, W[p + "post_attention_layernorm.weight"])
        h = norm(x, W[p + "pre_feedforward_layernorm.weight"])
        m = (gelu(h @ W[p + "mlp.gate_proj.weight"].T) * (h @ W[p + "mlp.up_proj.weight"].T)) @ W[p + "mlp.down_proj.weight"].T
        x = x + norm(m, W[p + "post_feedforward_layernorm.weight"])
    return (norm(x, W["model.norm.weight"]).astype(np.float32) @ E.T).astype(np.float64)


def test_independent_numpy_forward_agrees(tiny):
    ids = [2] + [int(x) for x in np.random.default_rng(1).integers(3, 4096, 23)]
    ref = numpy_forward(tiny.module.state_dict(), tiny.config, ids)
    got = tiny.module(torch.tensor([ids]))[0].numpy()
    assert snr_db(ref, got) > 100 and (ref.argmax(-1) == got.argmax(-1)).all()


def test_gguf_written_as_llama_cpp_does_reads_back(tiny, tmp_path):
    """A gemma3 GGUF written from the seeded model the way llama.cpp's converter writes it (norms stored as 1 + w,
    Q5_0 and Q8_0 projections, gemma3.* metadata) loads back as the same config, with the dequantized weights."""
    import gguf
    from gguf import GGMLQuantizationType as T

    from omni_export.families.gemma3.checkpoint import _BLOCK, load

    cfg, state = tiny.config, tiny.module.state_dict()

    def write(state) -> dict:
        w = gguf.GGUFWriter(str(tmp_path / "g.gguf"), "gemma3")
        for k, v in (("context_length", 512), ("embedding_length", 128), ("block_count", 6),
                     ("feed_forward_length", 384), ("attention.head_count", 4), ("attention.head_count_kv", 1), ("attention.key_length", 64),
                     ("attention.value_length", 64), ("attention.sliding_window", 16)):
            w.add_uint32(f"gemma3.{k}", v)
        w.add_float32("gemma3.attention.layer_norm_rms_epsilon", 1e-6)
        w.add_float32("gemma3.rope.freq_base", 1e6)
        inv = {v: k for k, v in _BLOCK.items()}
        expect = {}
        for key, t in state.items():
            if key == "lm_head.weight":
                continue
            a = t.numpy().astype(np.float32)
            if key.endswith("norm.weight"):
                name = "output_norm.weight" if key == "model.norm.weight" else None
                data, kind = a + np.float32(1), None
                expect[key] = (data - np.float32(1))
            else:
                kind = T.Q5_0 if "proj" in key and ".v_proj" not in key else T.Q8_0
                data = gguf.quants.quantize(a, kind)
                expect[key] = gguf.quants.dequantize(data, kind)
            if key == "model.embed_tokens.weight":
                name = "token_embd.weight"
            elif key != "model.norm.weight":
                i, rest = key.split(".")[2], ".".join(key.split(".")[3:-1])
                name = f"blk.{i}.{inv[rest]}.weight"
            w.add_tensor(name, data, raw_dtype=kind) if kind is not None else w.add_tensor(name, data)
        w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
        return expect

    expect = write(state)
    got = load(tmp_path / "g.gguf")
    assert got.config == cfg and got.tokenizer is None
    assert any("Q5_0 weights dequantized" in n for n in got.notes)
    sd = got.module.state_dict()
    for k, v in expect.items():
        assert np.array_equal(sd[k].numpy(), v), k
    assert got.module.lm_head.weight is got.module.model.embed_tokens.weight
    # A second open of the same bytes copies the values kept for their sha256: equal, and not shared with the first.
    again = load(tmp_path / "g.gguf").module.state_dict()
    assert all(np.array_equal(again[k].numpy(), v) for k, v in expect.items())
    sd["model.norm.weight"].add_(1.0)
    assert np.array_equal(load(tmp_path / "g.gguf").module.state_dict()["model.norm.weight"].numpy(),
                          expect["model.norm.weight"])
    # Other bytes at the same path are read afresh.
    changed = dict(state, **{"model.norm.weight": state["model.norm.weight"] + 0.5})
    expect = write(changed)
    sd = load(tmp_path / "g.gguf").module.state_dict()
    assert all(np.array_equal(sd[k].numpy(), v) for k, v in expect.items())


@pytest.mark.parametrize("arch, needle", [("gemma2", "is Gemma 2: not implemented"), ("gemma3n", "is Gemma 3n"),
                                          ("llama", "is not gemma3")])
def test_other_architectures_refused(tmp_path, arch, needle):
    import gguf

    from omni_export.families.gemma3.checkpoint import load

    w = gguf.GGUFWriter(str(tmp_path / "x.gguf"), arch)
    w.add_tensor("output_norm.weight", np.ones(8, np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(CheckpointError, match=needle):
        load(tmp_path / "x.gguf")


def test_hf_directory_round_trip(tiny, tmp_path):
    """The family's checkpoint writer and reader: HF names and Gemma's zero-centred norm weights as stored."""
    tiny.family.write_checkpoint(tiny, tmp_path / "ck")
    back = build_model("gemma3", checkpoint=tmp_path / "ck")
    assert back.config == tiny.config
    ids = torch.tensor([[2, 10, 20, 30]])
    assert torch.equal(back.module(ids), tiny.module(ids))


def test_gguf_header_reader_equals_gguf_reader(tmp_path):
    """``gguf_header.read_gguf`` (the fast header pass) gives what ``gguf.GGUFReader`` gives: every metadata value
    type, string and numeric arrays, and each tensor's name, dims, type and bytes; a bad magic or a truncated file
    is a one-line error."""
    import gguf
    from gguf import GGMLQuantizationType as T

    from omni_export.families.gemma3.gguf_header import read_gguf

    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "gemma3")
    w.add_uint8("t.u8", 7), w.add_int8("t.i8", -3), w.add_uint16("t.u16", 60000), w.add_int16("t.i16", -2)
    w.add_uint32("t.u32", 4_000_000_000), w.add_int32("t.i32", -5), w.add_float32("t.f32", 0.1)
    w.add_uint64("t.u64", 2**40), w.add_int64("t.i64", -(2**40)), w.add_float64("t.f64", 0.1), w.add_bool("t.b", True)
    w.add_string("t.s", "héllo ▁world")
    w.add_array("t.strs", ["a", "▁b", "<0x0A>", ""]), w.add_array("t.floats", [0.5, -1.25, 3.0])
    w.add_array("t.ints", [1, 2, 3])
    rng = np.random.default_rng(0)
    w.add_tensor("a.weight", rng.standard_normal((3, 32)).astype(np.float32))
    w.add_tensor("b.weight", gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), T.Q5_0),
                 raw_dtype=T.Q5_0)
    w.add_tensor("c.weight", rng.integers(0, 256, (2, 144), dtype=np.uint8), raw_dtype=T.Q4_K)  # raw blocks
    w.add_tensor("d.weight", rng.standard_normal(8).astype(np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    meta, tensors = read_gguf(tmp_path / "m.gguf")
    ref = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    assert meta == {k: f.contents() for k, f in ref.fields.items()} and len(meta) > 15
    assert meta["t.strs"] == ["a", "▁b", "<0x0A>", ""] and meta["t.f64"] == 0.1
    assert len(tensors) == len(ref.tensors) == 4
    for t, r in zip(tensors, ref.tensors):
        assert (t.name, t.shape, t.tensor_type) == (r.name, tuple(int(d) for d in r.shape), r.tensor_type)
        assert np.array_equal(gguf.quants.dequantize(t.data, t.tensor_type).ravel(),
                              gguf.quants.dequantize(r.data, r.tensor_type).ravel(), equal_nan=True), t.name
    raw = (tmp_path / "m.gguf").read_bytes()
    (tmp_path / "bad.gguf").write_bytes(b"GGUX" + raw[4:])
    with pytest.raises(CheckpointError, match="magic b'GGUX'"):
        read_gguf(tmp_path / "bad.gguf")
    (tmp_path / "cut.gguf").write_bytes(raw[:200])
    with pytest.raises(CheckpointError, match="truncated|past the end"):
        read_gguf(tmp_path / "cut.gguf")


def test_float_residual_adds_fp16_islands_to_the_decode_step_policy(tiny):
    """``float_residual`` leaves the decode step's residual Adds and RMSNorms float under w8a16 (recorded), on top of
    the decoder's shipped policy; off, the policy is the decoder's own; not a bool: a one-line error."""
    from omni_export.components.decoder_qdq import decoder_qdq_policy
    from omni_export.schemes import get_scheme

    step = tiny.family.components["decode_step"]
    w8a16 = get_scheme("w8a16")
    plain = step(tiny, context=32).qdq_policy("decode_step", None, w8a16)
    assert plain == decoder_qdq_policy(w8a16, prefill=False) and plain.float_ops == ()
    got = step(tiny, context=32, float_residual=True).qdq_policy("decode_step", None, w8a16)
    assert got.float_ops == ("rmsnorm", "residual_add") and "fp16_islands" in got.why
    assert dataclasses.replace(got, name=plain.name, float_ops=()) == plain  # nothing else changed
    rec = got.to_record()  # the manifest's record: the name, every setting as data, and why
    assert rec["policy"].endswith("float residual stream") and rec["settings"]["float_ops"] == ["rmsnorm", "residual_add"]
    assert rec["settings"]["range_margin"] == 2.0 and rec["fp16_islands"]
    assert step(tiny, context=32, float_residual=True).qdq_policy("decode_step", None, get_scheme("fp16")) is None
    with pytest.raises(ValueError, match="float_residual must be true or false, got 'yes'"):
        step(tiny, context=32, float_residual="yes")
