"""The Qwen3-TTS 12 Hz family: config (``config.py``), model (``model.py``), exported graphs (``graphs.py``), the forms
its blocks need on some targets (``forms.py``), checkpoint layout (``checkpoint.py``), the host loops (``host.py``),
its components (``talker.py``, ``predictor.py``, ``predictor_frame.py``, ``code2wav.py``), the text -> audio run report
(``end_to_end.py``) and its prompt sets (``prompts/``)."""
from __future__ import annotations

from functools import partial
from pathlib import Path

from ...checkpoints.tokenizer import speech_tokenizer
from .. import Family
from .checkpoint import load_checkpoint, save_checkpoint
from .code2wav import Code2WavComponent
from .config import PRESETS, Qwen3TTSConfig
from .end_to_end import end_to_end
from .model import Qwen3TTS, init_random
from .predictor import PredictorStepComponent, PredictorWindowComponent
from .predictor_frame import PredictorFrameComponent
from .talker import TalkerStepComponent


FAMILY = Family(
    name="qwen3_tts",
    presets=PRESETS,
    config_from_hf=lambda d: Qwen3TTSConfig.from_hf(d, d.get("speech_tokenizer", {})),
    config_to_hf=Qwen3TTSConfig.to_hf,
    build=Qwen3TTS,
    init_random=init_random,
    expected_keys=lambda m: m.expected_keys(),
    components={"talker_step": TalkerStepComponent, "code_predictor_step": PredictorStepComponent,
                "code_predictor_window": PredictorWindowComponent, "code_predictor_frame": PredictorFrameComponent,
                "code2wav_first": partial(Code2WavComponent, frames=1), "code2wav": partial(Code2WavComponent, frames=25)},
    load_checkpoint=load_checkpoint,
    save_checkpoint=lambda bundle, out: save_checkpoint(bundle.module, out),
    end_to_end=end_to_end,
    tokenizer=lambda cfg, checkpoint: speech_tokenizer(cfg.text_vocab_size),
    prompts=Path(__file__).parent / "prompts",
)
