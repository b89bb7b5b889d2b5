"""From a torch graph to the files a target ships, shared by the targets: torch -> ONNX (``onnx_export``), rewrites of
an exported ONNX graph (``onnx_rewrites``), what the ``torch.export``-based lowerings share (``torch_export``) and per-part
work in worker processes (``parallel``)."""
