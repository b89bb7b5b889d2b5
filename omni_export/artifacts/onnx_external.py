"""Saving ONNX models with external data from any working directory.

onnx's ``convert_model_to_external_data`` (what ``onnx.save_model(save_as_external_data=True)`` and onnxruntime's
quantizer call) refuses a ``location`` that exists relative to the *current directory*, not to the model's folder:
run from a folder holding, say, ``model.onnx.data``, every such save fails with "External data file exists in
model.onnx.data", though it writes into a fresh directory elsewhere. While ``beside_the_model()`` is active that
conversion marks the same tensors for the same file without looking at the current directory; the files written
are the same bytes. Every caller here writes into a fresh directory (a step's temporary directory), where nothing
of that name can exist yet."""
from __future__ import annotations

import contextlib
import sys


@contextlib.contextmanager
def beside_the_model():
    import onnx
    from onnx import external_data_helper as edh

    saved = edh.convert_model_to_external_data

    def convert(model, all_tensors_to_one_file=True, location=None, size_threshold=1024, convert_attribute=False):
        if not (all_tensors_to_one_file and location):  # the per-tensor and unnamed forms never look at the cwd
            return saved(model, all_tensors_to_one_file, location, size_threshold, convert_attribute)
        if edh.os.path.isabs(location):
            raise ValueError("location must be a relative path that is relative to the model path.")
        tensors = edh._get_all_tensors(model) if convert_attribute else edh._get_initializer_tensors(model)
        for tensor in tensors:
            if tensor.HasField("raw_data") and sys.getsizeof(tensor.raw_data) >= size_threshold:
                edh.set_external_data(tensor, location)

    edh.convert_model_to_external_data = onnx.convert_model_to_external_data = convert
    try:
        yield
    finally:
        edh.convert_model_to_external_data = onnx.convert_model_to_external_data = saved
