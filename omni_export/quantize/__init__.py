"""QDQ quantization machinery the targets share: the per-graph policy plan (``policy``), the calibration passes that
give activation ranges (``minmax_pass`` over ``minmax_graph``, ``histogram_pass``, batched by ``calib_batch``), the
per-channel weight-scale search (``scale_search``), onnxruntime's quantizer driven over one graph (``qdq``, with
``quantizer_rewiring``), one graph's build under its component's policy (``part``), the mixed-precision pass
(``mixed``) and the Genie bundles' quantization (``genie_qdq``). No target is defined here: targets live in
``exporters``, one module each."""
