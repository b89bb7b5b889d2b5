"""MiniCPM-o TTS head: the llama family's layers under emb_code / head_code, weight norm folded, hidden_text_merge
conditions on the host, and the generic decode step / prefill driving it (cached == whole-sequence reference)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from omni_export.families.llama.model import LlamaModel
from omni_export.families.minicpmo.components import TTSHeadPrefill, TTSHeadStep, llm_hidden
from omni_export.families.minicpmo.config import AUDIO_BOS, PRESETS, TEXT_EOS
from omni_export.families.minicpmo.model import MiniCPMOSpeech, init_random
from omni_export.families.minicpmo.tts import fold_weight_norm
from omni_export.blocks.layers import FULL, causal_mask, rope_table
from omni_export.parity.metrics import snr_db

CFG = PRESETS["tiny"]


@pytest.fixture(scope="module")
def bundle():
    from types import SimpleNamespace
    m = init_random(MiniCPMOSpeech(CFG), 0).eval()
    return SimpleNamespace(module=m, config=CFG, source="seeded random (preset tiny, seed 0)", weights_hash="h")


def _full_logits(head, rows: np.ndarray) -> np.ndarray:
    lm = head.lm()
    cos, sin = (torch.from_numpy(t)[None, None] for t in rope_table(lm.config.inv_freq(FULL), np.arange(len(rows))))
    empty = torch.zeros(1, lm.config.num_key_value_heads, 0, lm.config.head_dim)
    x = torch.from_numpy(rows)[None]
    with torch.no_grad():
        for layer in lm.model.layers:
            x, _, _ = layer(x, cos, sin, causal_mask(len(rows)), empty, empty)
        return lm.lm_head(lm.model.norm(x))[0].numpy()


def test_head_is_the_llama_family_model_with_one_codebook(bundle):
    head = bundle.module.tts
    assert isinstance(head.model, LlamaModel)
    lm = head.lm()
    assert lm.config.vocab_size == 6562 and lm.lm_head is head.head_code[0]
    assert lm.input_embedding() is head.emb_code[0]
    keys = bundle.module.expected_keys()
    assert keys["tts.emb_code.0.weight"] == (6562, 64) and keys["tts.head_code.0.weight"] == (6562, 64)
    assert keys["tts.projector_semantic.linear1.weight"] == (64, CFG.llm_hidden)
    assert "tts.model.layers.1.self_attn.q_proj.weight" in keys
    real = PRESETS["4.5"].tts
    assert (real.num_hidden_layers, real.hidden_size, real.num_attention_heads, real.num_key_value_heads,
            real.head_dim, real.intermediate_size) == (20, 768, 12, 12, 64, 3072)


def test_weight_norm_fold():
    g, v = torch.rand(6562, 1) + 0.5, torch.randn(6562, 8)
    w = fold_weight_norm(g, v)
    assert torch.allclose(w.norm(dim=1, keepdim=True), g, atol=1e-6)
    lin = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(8, 6562, bias=False))
    with torch.no_grad():
        lin.parametrizations.weight.original0.copy_(g)
        lin.parametrizations.weight.original1.copy_(v)
    assert torch.allclose(lin.weight, w, atol=1e-6)


def test_conditions_are_text_plus_normalised_projection(bundle):
    head = bundle.module.tts
    ids, h = [5, 6, 7], llm_hidden("hi", 3, CFG.llm_hidden)
    rows = head.conditions(ids, h, last_chunk=True)
    assert rows.shape == (5, 64)
    with torch.no_grad():
        proj = F.normalize(head.projector_semantic(torch.from_numpy(h)), dim=-1)
        assert np.allclose(rows[:3], (head.emb_text(torch.tensor(ids)) + proj).numpy(), atol=1e-6)
        tail = head.emb_text(torch.tensor([TEXT_EOS, AUDIO_BOS]) % CFG.text_vocab_size).numpy()
    assert np.allclose(rows[3:], tail) and head.conditions(ids, h, last_chunk=False).shape == (4, 64)


def test_generic_decode_step_and_prefill_drive_the_head(bundle):
    step = TTSHeadStep(bundle, context=48)
    ids = step.encode("Hello there.", 16)
    assert len(ids) == 1 + 12 + 2 and min(ids) >= 6562     # bos + 12 bytes + text_eos + audio_bos, past the codes
    outs, gen = step.run_tokens(step.eager_runner(), ids, n_new=8)
    assert outs["logits"].shape == (22, 1, 6562) and all(0 <= t < 6562 for t in gen)
    rows = step.embedding[ids + gen[:-1]]
    ref = _full_logits(bundle.module.tts, rows)
    assert snr_db(ref, outs["logits"][:, 0]) > 100.0
    # a fresh component (another process) traces a cached reference: the condition rows travel with it
    from omni_export.components.base import PromptSet
    prompts = PromptSet.from_text("t", "Hello there.\n")
    seqs = step.reference(prompts, {"max_prompt_tokens": 16, "new_tokens": 8})
    fresh = TTSHeadStep(bundle, context=48)
    fresh.encode("Another text, encoded first.", 16)               # its own rows take the ids the reference used
    tr = fresh.trace(step.eager_runner(), seqs, None)
    assert np.array_equal(tr[0].outputs["logits"], seqs[0].outputs["logits"])
    pre = TTSHeadPrefill(bundle, context=48)
    got = pre.prefill(pre.eager_runner(), pre.encode("Hello there.", 16))
    assert snr_db(ref[:15], got["logits"].reshape(-1, 6562)[:15]) > 100.0
