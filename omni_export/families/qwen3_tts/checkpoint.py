"""Qwen3-TTS checkpoints: the released model directory with the 12 Hz tokenizer in ``speech_tokenizer/``."""
from __future__ import annotations

import json
from pathlib import Path

from ...artifacts.hashing import hash_value
from ...artifacts.store import atomic_dir
from ...errors import CheckpointError
from ...models.checkpoint import checkpoint_hash, load_state_dict, read_config
from .config import Qwen3TTSConfig
from .model import Qwen3TTS

TOKENIZER_DIR = "speech_tokenizer"


def load_checkpoint(ckpt: Path):
    """-> (config, state_dict, weights hash). Talker + predictor keys from ``<ckpt>/*.safetensors`` (the Base
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
    expected = Qwen3TTS(cfg).expected_keys()
    opt = ("talker.code_predictor.small_to_mtp_projection.",)
    main = {k: v for k, v in expected.items() if k.startswith("talker.")}
    dec = {k[len("speech_tokenizer."):]: v for k, v in expected.items() if k.startswith("speech_tokenizer.")}
    state = load_state_dict(ckpt, main, ignore_prefixes=("speaker_encoder.",), optional=opt)
    state |= {f"speech_tokenizer.{k}": v for k, v in load_state_dict(tok, dec, ignore_prefixes=("encoder.",)).items()}
    return cfg, state, hash_value([checkpoint_hash(ckpt), checkpoint_hash(tok)])


def save_checkpoint(model: Qwen3TTS, ckpt: Path) -> None:
    """Write the official layout (tests, and a stand-in for a downloaded model directory)."""
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
