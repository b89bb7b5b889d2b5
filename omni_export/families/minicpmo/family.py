"""The ``minicpmo`` family entry: MiniCPM-o 4.5 speech output (TTS head + Token2wav flow and HiFT)."""
from __future__ import annotations

from pathlib import Path

from ...checkpoints.tokenizer import speech_tokenizer
from ...errors import CheckpointError
from .. import Family
from .config import PRESETS, MiniCPMOConfig
from .end_to_end import end_to_end
from .model import MiniCPMOSpeech, init_random
from .vocoder import COMPONENTS


def load_checkpoint(path):
    """Official weights are three files (the ``tts.`` keys, ``flow.pt``, ``hift_original.pt``); their layouts are
    read by ``checkpoint.split_state``, but no directory reader is wired here yet."""
    raise CheckpointError(f"checkpoint {Path(path).name}: minicpmo reads seeded presets only (the official layouts "
                          f"convert with minicpmo.checkpoint.split_state)")


FAMILY = Family.declare("minicpmo", MiniCPMOConfig, MiniCPMOSpeech, __file__, presets=PRESETS,
                        init_random=init_random, components=COMPONENTS, load_checkpoint=load_checkpoint, end_to_end=end_to_end,
                        tokenizer=lambda cfg, checkpoint: speech_tokenizer(cfg.text_vocab_size))
