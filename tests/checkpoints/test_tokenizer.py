"""The checkpoint's tokenizer: tokenizer.json through the tokenizers library, the BPE a GGUF embeds (same ids as the
tokenizer.json it came from), canonical hashes, and the byte tokenizer matching calibration.prompts.ByteTokenizer."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from ckpt_builders import CORPUS, HIDDEN, write_gguf
from omni_export.checkpoints import byte_tokenizer, open_checkpoint
from omni_export.errors import BadInput, CheckpointError

TEXTS = ["The capital of France is Paris.", "Numbers 12345, café — 日本語 😀\n\n  two spaces\ttab",
         "<|im_start|>user\nHello there<|im_end|>\n", ""]


def _hf_dir(d, tok, tokenizer_config: dict | None = None, config: dict | None = None):
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config or {"model_type": "llama"}))
    save_file({"model.norm.weight": torch.ones(HIDDEN)}, str(d / "model.safetensors"))
    if tok is not None:
        tok.save(str(d / "tokenizer.json"))
    if tokenizer_config is not None:
        (d / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return d


def test_tokenizer_json_round_trip_and_specials(tmp_path, trained_tokenizer):
    d = _hf_dir(tmp_path / "ck", trained_tokenizer, {"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"}})
    tok = open_checkpoint(d).tokenizer
    assert tok.name == "ck/tokenizer.json" and tok.vocab_size == trained_tokenizer.get_vocab_size()
    assert (tok.bos_id, tok.eos_id) == (trained_tokenizer.token_to_id("<|im_start|>"), trained_tokenizer.token_to_id("<|im_end|>"))
    for s in TEXTS:
        ids = tok.encode(s)
        assert ids == trained_tokenizer.encode(s).ids
        assert tok.decode(ids) == s
    ids = tok.encode("<|im_start|>user")
    assert ids[0] == tok.bos_id and tok.id_to_token(ids[0]) == "<|im_start|>"  # one special token
    assert tok.encode(TEXTS[0], max_tokens=3) == tok.encode(TEXTS[0])[:3]
    assert len(tok.hash) == 64


def test_hash_is_canonical(tmp_path, trained_tokenizer):
    from tokenizers import Tokenizer as Backend

    a = open_checkpoint(_hf_dir(tmp_path / "a", trained_tokenizer)).tokenizer
    # the same tokenizer re-serialised with different formatting hashes the same
    d = _hf_dir(tmp_path / "b", None)
    (d / "tokenizer.json").write_text(json.dumps(json.loads(trained_tokenizer.to_str()), indent=4))
    b = open_checkpoint(d).tokenizer
    assert a.hash == b.hash
    other = Backend.from_str(trained_tokenizer.to_str())
    other.add_special_tokens(["<extra>"])
    c = open_checkpoint(_hf_dir(tmp_path / "c", other)).tokenizer
    assert c.hash != a.hash
    ids_cfg = open_checkpoint(_hf_dir(tmp_path / "e", trained_tokenizer, config={"bos_token_id": 1, "eos_token_id": [2, 0]})).tokenizer
    assert (ids_cfg.bos_id, ids_cfg.eos_id) == (1, 2) and ids_cfg.hash != a.hash  # bos/eos are part of the hash


def test_bad_tokenizer_files_refused(tmp_path, trained_tokenizer):
    d = _hf_dir(tmp_path / "ck", None)
    (d / "tokenizer.json").write_text("{broken")
    with pytest.raises(CheckpointError, match="tokenizer.json is not a readable tokenizers file"):
        open_checkpoint(d)
    d2 = _hf_dir(tmp_path / "ck2", trained_tokenizer, {"eos_token": "<|nope|>"})
    with pytest.raises(CheckpointError, match=r"special token '<\|nope\|>' is not in the tokenizer's vocabulary"):
        open_checkpoint(d2)
    d3 = _hf_dir(tmp_path / "ck3", None)
    (d3 / "tokenizer.model").write_bytes(b"sentencepiece")
    ck = open_checkpoint(d3)
    assert ck.tokenizer is None and "no tokenizer.json (tokenizer.model is not read)" in ck.notes


def test_gguf_embedded_bpe_matches_its_tokenizer_json(tmp_path, trained_tokenizer):
    p = write_gguf(tmp_path / "m.gguf", {"token_embd.weight": (np.zeros((trained_tokenizer.get_vocab_size(), HIDDEN), np.float32), "F32")},
                   tokenizer=trained_tokenizer)
    tok = open_checkpoint(p).tokenizer
    assert tok.name == "gguf:m" and tok.vocab_size == trained_tokenizer.get_vocab_size()
    assert tok.bos_id == trained_tokenizer.token_to_id("<|im_start|>")
    for s in TEXTS + CORPUS[:5]:
        assert tok.encode(s) == trained_tokenizer.encode(s).ids, s
        assert tok.decode(tok.encode(s)) == s
    assert tok.encode("<|im_end|>") == [trained_tokenizer.token_to_id("<|im_end|>")]


def test_gguf_add_bos_and_unsupported_tokenizers(tmp_path, trained_tokenizer):
    emb = {"token_embd.weight": (np.zeros((trained_tokenizer.get_vocab_size(), HIDDEN), np.float32), "F32")}
    p = write_gguf(tmp_path / "bos.gguf", emb, tokenizer=trained_tokenizer, meta={"tokenizer.ggml.add_bos_token": True})
    tok = open_checkpoint(p).tokenizer
    assert tok.encode("hi")[0] == tok.bos_id and tok.encode("hi")[1:] == trained_tokenizer.encode("hi").ids
    for meta, needle in (({"tokenizer.ggml.model": "llama"}, "tokenizer.ggml.model 'llama' is not supported"),):
        q = write_gguf(tmp_path / "spm.gguf", emb, meta=meta)
        with pytest.raises(CheckpointError, match=needle):
            open_checkpoint(q)


def _old_encode(s, max_tokens=None):  # the ids of the byte tokenizer this replaced (calibration.prompts.ByteTokenizer)
    ids = [1] + [b + 3 for b in s.encode("utf-8")]
    return ids[:max_tokens] if max_tokens else ids


@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2", "smollm", "gpt-2"])
def test_gguf_pre_tokenizer_types_round_trip(tmp_path, trained_tokenizer, pre):
    emb = {"token_embd.weight": (np.zeros((trained_tokenizer.get_vocab_size(), HIDDEN), np.float32), "F32")}
    tok = open_checkpoint(write_gguf(tmp_path / "m.gguf", emb, tokenizer=trained_tokenizer, pre=pre)).tokenizer
    for s in TEXTS + CORPUS[:5]:
        assert tok.decode(tok.encode(s)) == s
    pieces = [p for p, _ in tok._tok.pre_tokenizer.pre_tokenize_str("x 12345")]
    assert pieces == {"llama-bpe": ["x", "Ġ", "123", "45"], "qwen2": ["x", "Ġ", *"12345"], "smollm": ["x", "Ġ", *"12345"],
                      "gpt-2": ["x", "Ġ12345"]}[pre]


def test_gguf_unknown_pre_tokenizer_refused(tmp_path, trained_tokenizer):
    emb = {"token_embd.weight": (np.zeros((trained_tokenizer.get_vocab_size(), HIDDEN), np.float32), "F32")}
    with pytest.raises(CheckpointError, match="tokenizer.ggml.pre 'tekken' is not supported"):
        open_checkpoint(write_gguf(tmp_path / "m.gguf", emb, tokenizer=trained_tokenizer, pre="tekken"))


def test_byte_tokenizer_matches_existing_byte_tokenizer():
    new = byte_tokenizer(300)
    assert (new.name, new.vocab_size, new.bos_id, new.eos_id) == ("bytes+3", 300, 1, 2)
    for s in TEXTS:
        assert new.encode(s) == _old_encode(s)
        assert new.encode(s, max_tokens=4) == _old_encode(s, max_tokens=4)
        assert new.decode(new.encode(s)) == s
    assert new.encode("A") == [1, 65 + 3]
    assert new.decode([1, 68, 0, 299, 2]) == "A\ufffd"  # reserved ids vanish, ids above the byte range show U+FFFD
    assert new.hash == byte_tokenizer(300).hash != byte_tokenizer(512).hash
    with pytest.raises(BadInput, match="too small for the byte tokenizer"):
        byte_tokenizer(258)
