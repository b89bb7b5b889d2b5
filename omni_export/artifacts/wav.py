"""16-bit mono PCM .wav files of a run's audio (the end-to-end reports), written atomically."""
from __future__ import annotations

import io
import wave
from pathlib import Path
from typing import Callable

import numpy as np

from .atomic import write_bytes_atomic


def write_wav(path: Path, audio: np.ndarray, sr: int) -> None:
    """Mono 16-bit PCM, written through the package's one atomic writer (never half-written)."""
    pcm = (np.clip(audio, -1.0, 1.0) * 32767.0).round().astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sr)
        w.writeframes(pcm.tobytes())
    write_bytes_atomic(Path(path), buf.getvalue())


def wav_writer(wavs: dict[str, np.ndarray], sr: int) -> Callable[[Path], list[str]]:
    """A family end-to-end report's ``write_files``: writes each named waveform into the report directory."""
    def write_files(report_dir: Path) -> list[str]:
        Path(report_dir).mkdir(parents=True, exist_ok=True)
        for name, w in wavs.items():
            write_wav(Path(report_dir) / name, w, sr)
        return sorted(wavs)
    return write_files
