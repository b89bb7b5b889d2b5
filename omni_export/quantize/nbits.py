"""Weight-only blockwise quantization of an ONNX graph's MatMuls with onnxruntime's own ``MatMulNBitsQuantizer``:
each MatMul whose weight is a constant becomes a ``MatMulNBits`` (symmetric integer weights, one fp32 scale per
``block`` values along the reduction axis); activations stay fp32 and the CPU EP computes in fp32
(``accuracy_level`` 1). What onnxruntime-genai's model builder ships for the CPU, at the bits a scheme names.

``quantize_matmuls`` returns the per-tensor record the manifest keeps: every MatMul it quantized (by weight) and
every one it left fp32 with the reason (a weight that is not a constant: a tied LM head reads the embedding table
through a Transpose)."""
from __future__ import annotations

import ast
import contextlib
import logging
from pathlib import Path

ACCURACY_LEVEL = 1  # MatMulNBits' fp32 compute: the block's weights dequantized, activations untouched


def _scope(node) -> str:
    """The torch module a node was exported from (torch.onnx's ``name_scopes``), else the node's name."""
    for p in node.metadata_props:
        if p.key == "pkg.torch.onnx.name_scopes":
            with contextlib.suppress(ValueError, SyntaxError):
                scopes = ast.literal_eval(p.value)
                if len(scopes) > 1 and scopes[-2]:
                    return scopes[-2]
    return node.name


def _matmuls(graph) -> dict[str, tuple[str, str]]:
    """MatMul node name -> (its module, its second input's name)."""
    return {n.name: (_scope(n), n.input[1]) for n in graph.node if n.op_type == "MatMul"}


def quantize_matmuls(src: Path, dst: Path, bits: int, block: int) -> dict:
    """``src`` (an fp32 ONNX file with external data) with every constant-weight MatMul as ``MatMulNBits`` of
    ``bits`` in blocks of ``block``, written to ``dst`` (+ ``dst.name + '.data'``); the record of what each got."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    from ..artifacts.onnx_external import beside_the_model

    model = onnx.load(str(src))
    before = _matmuls(model.graph)
    consts = {t.name for t in model.graph.initializer}
    cfg = DefaultWeightOnlyQuantConfig(block_size=block, is_symmetric=True, accuracy_level=ACCURACY_LEVEL, bits=bits)
    quiet = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        q = MatMulNBitsQuantizer(model, bits=bits, block_size=block, is_symmetric=True,
                                 accuracy_level=ACCURACY_LEVEL, algo_config=cfg)
        q.process()
    finally:
        quiet.setLevel(level)
    out = q.model.model
    left = _matmuls(out.graph)
    const_left = sorted(scope for scope, w in left.values() if w in consts)
    if const_left or not set(left) <= set(before):
        raise RuntimeError(f"MatMulNBits left constant-weight MatMuls float or renamed MatMuls: {const_left[:3]}")
    quantized = sorted(scope for n, (scope, _) in before.items() if n not in left)
    with beside_the_model():
        onnx.save_model(out, str(dst), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=dst.name + ".data")
    return {"op": "MatMulNBits", "bits": bits, "block_size": block, "symmetric": True,
            "accuracy_level": ACCURACY_LEVEL, "activations": "fp32",
            "quantized": {"count": len(quantized), "modules": quantized},
            "float": {"count": len(left), "modules": sorted({scope for scope, _ in left.values()}),
                      "why": "the second input is computed in the graph (attention's keys and values, a tied head's "
                             "transposed embedding table): no constant weight to quantize"}}
