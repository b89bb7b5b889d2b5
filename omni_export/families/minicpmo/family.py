"""The ``minicpmo`` family entry: MiniCPM-o 4.5 speech output (TTS head + Token2wav flow and HiFT)."""
from __future__ import annotations

from ...checkpoints.tokenizer import speech_tokenizer
from .. import Family
from .config import PRESETS, MiniCPMOConfig
from .end_to_end import end_to_end
from .model import MiniCPMOSpeech, init_random
from .official import load_official
from .release_layout import save_release
from .vocoder import COMPONENTS


FAMILY = Family.declare("minicpmo", MiniCPMOConfig, MiniCPMOSpeech, __file__, presets=PRESETS,
                        init_random=init_random, components=COMPONENTS, load_checkpoint=load_official, end_to_end=end_to_end,
                        save_checkpoint=lambda bundle, out: save_release(bundle.module, bundle.config, out),
                        tokenizer=lambda cfg, checkpoint: speech_tokenizer(cfg.text_vocab_size))
