"""Histogram calibration (percentile, entropy, distribution) in bounded memory: onnxruntime's own calibrator, fed
the samples in chunks.

``quantize_static`` hands its histogram calibrator the whole calibration reader in one ``collect_data`` call, which
keeps every sample's value of every calibrated tensor until the reader ends: on the SmolLM2 decode step (1,024
samples, ~1,900 tensors) that grew past 24 GB and the kernel killed ``omni-export sweep``. onnxruntime's collector
merges histograms across ``collect_data`` calls (its own ``CalibStridedMinMax`` option calls it once per stride), so
here the reader is cut into chunks of at most ``CHUNK_BYTES`` of calibrated values and each chunk is one call. Where
every sample fits in one chunk (the tiny presets) that is one call, the ranges ``quantize_static`` computes itself
(tested); with more chunks a histogram whose range grows is widened with bins of the first chunk's width, as
onnxruntime's strided option widens it. The ranges go to an ORT calibration cache that ``quantize_static`` reads."""
from __future__ import annotations

import math
import tempfile
from pathlib import Path

from ..errors import CalibrationError

CHUNK_BYTES = 512 << 20  # calibrated values held at once (onnxruntime then concatenates them per tensor)

# quantize_static's extra_options -> its calibrator's options (the names its own ``calib_extra_options`` maps)
_CALIB_OPTIONS = (("CalibTensorRangeSymmetric", "symmetric"), ("CalibMovingAverage", "moving_average"),
                  ("CalibMovingAverageConstant", "averaging_constant"),
                  ("CalibMaxIntermediateOutputs", "max_intermediate_outputs"), ("CalibPercentile", "percentile"))


class _Peekable:
    """``reader`` read one feed ahead: ``head`` is the next feed, None at the end."""

    def __init__(self, reader):
        self.reader, self.head = reader, reader.get_next()

    def get_next(self):
        feed, self.head = self.head, (self.reader.get_next() if self.head is not None else None)
        return feed


class _Chunk:
    """At most ``n`` feeds of ``reader``, then None (``taken``: how many it handed out)."""

    def __init__(self, reader, n: int):
        self.reader, self.n, self.taken = reader, n, 0

    def get_next(self):
        if self.taken == self.n:
            return None
        feed = self.reader.get_next()
        self.taken += feed is not None
        return feed


def samples_per_chunk(src: Path, op_types) -> int:
    """Samples whose calibrated values (every float activation of a node of ``op_types``) fit in ``CHUNK_BYTES``."""
    from .minmax_pass import calibrated_tensors

    _, infos, chosen = calibrated_tensors(src, op_types)
    per = 0
    for t in chosen:
        dims = infos[t].type.tensor_type.shape.dim
        per += 4 * math.prod(d.dim_value if d.HasField("dim_value") else 1 for d in dims)
    return max(1, CHUNK_BYTES // max(per, 1))


def calibrate_histogram(src: Path, reader, cache: Path, method, op_types, providers, extra_options: dict) -> int:
    """Ranges of ``method`` (an onnxruntime ``CalibrationMethod``) over ``reader``'s samples, written to ``cache``
    (an ORT calibration cache); returns the number of ``collect_data`` calls."""
    from onnxruntime.quantization.calibrate import create_calibrator, save_tensors_data

    opts = extra_options or {}
    calib = {key: opts[name] for name, key in _CALIB_OPTIONS if name in opts}
    n = samples_per_chunk(src, op_types)
    calls, samples, stream = 0, 0, _Peekable(reader)
    with tempfile.TemporaryDirectory(prefix="omni-hist-") as tmp:
        cal = create_calibrator(Path(src), op_types, augmented_model_path=str(Path(tmp) / "augmented.onnx"),
                                calibrate_method=method, use_external_data_format=True, providers=providers,
                                extra_options=calib)
        while stream.head is not None:  # never an empty chunk: onnxruntime refuses one
            chunk = _Chunk(stream, n)
            cal.collect_data(chunk)
            calls, samples = calls + 1, samples + chunk.taken
        if samples == 0:
            raise CalibrationError("the calibration stream is empty: no activation ranges")
        save_tensors_data(cal.compute_data(), cache)
        del cal
    return calls
