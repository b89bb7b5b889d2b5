"""The shipped Qwen3-TTS recipes made small for the tests (one parity prompt, small simulator budgets), one definition
for ``tests/recipes/test_qwen3_tts_recipes.py`` and ``tests/commands/test_sweep_qwen3_tts.py``."""
import os
from importlib import resources

import yaml

from shared_stores import session_dir


def small_recipe(name, tmp_path_factory) -> dict:
    """The shipped recipe with one parity prompt (26 frames: the 1 + 25 schedule) and small simulator budgets; the
    builds, thresholds and calibration are the shipped ones. Its prompt file lives in the session's shared directory,
    so every test (and xdist worker) that asks gets the same recipe, and the same shared store
    (``tests/commands/test_sweep_qwen3_tts.py`` starts from the w8a16 one's cache)."""
    d = yaml.safe_load(resources.files("omni_export.recipes").joinpath(f"{name}.yaml").read_text())
    par, text = session_dir(tmp_path_factory) / "qwen3_tts_one_prompt.txt", "The quick brown fox jumps over the lazy dog.\n"
    if not par.is_file() or par.read_text() != text:  # written once, atomically: other workers may be reading it
        tmp = par.with_name(f"{par.name}.{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, par)
    d["prompts"].update(parity=str(par))
    d["parity"] = {"new_tokens": 26, "simulator_steps": 16}
    # calibration stays as shipped: a smaller set misses the late-position ranges (talker K/V rows fell to 23.5 dB)
    d["options"] = {"code2wav_first": {"simulator_chunks": 2}, "code2wav": {"simulator_chunks": 1}}
    return d
