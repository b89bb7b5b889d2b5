"""Qwen3-TTS checkpoints: the released model directory with the 12 Hz tokenizer in ``speech_tokenizer/``; both
directories are read through the checked safetensors reader (``checkpoints.hf``: index honoured, stale shards and
duplicate keys refused before any tensor is read)."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ...artifacts.hashing import hash_value
from ...artifacts.store import atomic_dir
from ...errors import CheckpointError
from ...checkpoints.hf import check_keys, checkpoint_hash, load_state_dict, locate, read_config
from .config import Qwen3TTSConfig
from .model import Qwen3TTS

TOKENIZER_DIR = "speech_tokenizer"


def load_checkpoint(ckpt: Path):
    """-> (config, state_dict, weights hash, notes). Talker + predictor keys from ``<ckpt>/*.safetensors`` (the Base
    models' ``speaker_encoder.*`` is ignored), decoder keys from ``<ckpt>/speech_tokenizer/*.safetensors``
    (its ``encoder.*`` is ignored) under the prefix ``speech_tokenizer.``."""
    ckpt = Path(ckpt)
    tok = ckpt / TOKENIZER_DIR
    if not tok.is_dir():
        raise CheckpointError(f"checkpoint {ckpt} has no {TOKENIZER_DIR}/ directory (the 12 Hz tokenizer)")
    try:
        cfg = Qwen3TTSConfig.from_hf(read_config(ckpt), read_config(tok))
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint {ckpt}: config.json does not describe a Qwen3-TTS 12 Hz model: {e}") from None
    infos = [locate(d)[2] for d in (ckpt, tok)]  # both layouts checked from the headers before any tensor is read
    with torch.device("meta"):
        expected = Qwen3TTS(cfg).expected_keys()
    main = {k: v for k, v in expected.items() if k.startswith("talker.")}
    dec = {k[len("speech_tokenizer."):]: v for k, v in expected.items() if k.startswith("speech_tokenizer.")}
    for d, info, want, skip in ((ckpt, infos[0], main, ("speaker_encoder.",)), (tok, infos[1], dec, ("encoder.",))):
        check_keys(d.name, {k: s for k, (_, s) in info.items()}, want, skip)
    state = load_state_dict(ckpt, main, ignore_prefixes=("speaker_encoder.",))
    state |= {f"speech_tokenizer.{k}": v for k, v in load_state_dict(tok, dec, ignore_prefixes=("encoder.",)).items()}
    return cfg, state, hash_value([checkpoint_hash(ckpt), checkpoint_hash(tok)]), ()


def save_checkpoint(model: Qwen3TTS, ckpt: Path) -> None:
    """Write the official layout atomically (``omni-export checkpoint --family qwen3_tts``, tests, and a stand-in
    for a downloaded model directory): what ``load_checkpoint`` reads back."""
    from safetensors.torch import save_file

    hf = model.config.to_hf()
    sd = model.state_dict()
    with atomic_dir(Path(ckpt)) as tmp:
        (tmp / "config.json").write_text(json.dumps({"model_type": "qwen3_tts", "talker_config": hf["talker_config"]}, indent=2))
        save_file({k: v.contiguous() for k, v in sd.items() if k.startswith("talker.")}, str(tmp / "model.safetensors"))
        (tmp / TOKENIZER_DIR).mkdir()
        (tmp / TOKENIZER_DIR / "config.json").write_text(json.dumps(hf["speech_tokenizer"] | {
            "model_type": "qwen3_tts_tokenizer_12hz", "output_sample_rate": model.config.decoder.sample_rate}, indent=2))
        save_file({k[len("speech_tokenizer."):]: v.contiguous() for k, v in sd.items() if k.startswith("speech_tokenizer.")},
                  str(tmp / TOKENIZER_DIR / "model.safetensors"))
