"""The ``onnx_genai`` target's ``w8a16`` bundle: GenAI's decoder form (``components.decoder_runner.GenaiStep``, one
graph for the prompt and every generated token) quantized as the ``qdq_onnx`` target quantizes the decode step,
under ``decoder_qdq.genai_qdq_policy``, for onnxruntime's CPU EP.

- The graph: the fp32 bundle's ``model.onnx`` with its projections as 1x1 convs over a dynamic row count
  (``onnx_rewrites.matmul_as_conv(..., dynamic_rows=True)``) and its RMSNorms fused: the names the policy's patterns
  read.
- Calibration: GenAI's own calls over the calibration prompts, made by the eager fp32 GenAI form: each prompt in one
  call (row 0, the attention sink, included), then one call per greedy token (``calibration_feeds``).
- IO: float32, as GenAI feeds it. Each layer's past input, its new row and the present the graph concatenates
  share one int16 symmetric encoding (``policy.matmul_rhs_groups``), and each ``present.N`` is written in the
  encoding its ``past_key_values.N`` is read with (``genie_qdq.write_outputs_in_input_encoding``), so a row GenAI
  feeds back re-quantizes to the code it was written with."""
from __future__ import annotations

import shutil
from pathlib import Path

from ..components.base import Graph
from ..components.decoder_qdq import genai_qdq_policy
from ..errors import CalibrationError, UnsupportedError
from ..lowering.onnx_rewrites import fuse_rmsnorm, matmul_as_conv
from ..lowering.parallel import PartPool
from .genie_qdq import io_encodings, write_outputs_in_input_encoding
from .part import QdqPart
from .policy import load_ranges, merge_groups, shared_encodings, static_plan


def calibration_feeds(forms, prompt_ids: list[list[int]], new_tokens: int):
    """GenAI's calls over each calibration prompt, as the eager fp32 GenAI form makes them: the whole prompt in one
    call (no past), then ``new_tokens`` calls of one greedy token each over the presents before them (within the
    context)."""
    import torch

    module, cfg = forms.genai_module(), forms.cfg
    shape = (1, cfg.num_key_value_heads, 0, cfg.head_dim)
    for ids in prompt_ids:
        past = [torch.zeros(shape) for _ in range(2 * cfg.num_hidden_layers)]
        x, at = torch.tensor([ids], dtype=torch.int64), 0
        for _ in range(min(new_tokens, forms.context - len(ids)) + 1):
            n = x.shape[1]
            feed = (x, torch.ones((1, at + n), dtype=torch.int64), torch.arange(at, at + n).unsqueeze(0), *past)
            yield {k: v.numpy() for k, v in zip(module.input_names, feed)}
            with torch.no_grad():
                logits, *past = module(*feed)
            x, at = logits[:, -1:].argmax(-1), at + n


def kv_pairs(cfg) -> list[tuple[str, str]]:
    """Each layer's ``(past_key_values.N.key|value, present.N.key|value)``: GenAI feeds the one back as the other."""
    return [(f"past_key_values.{i}.{kv}", f"present.{i}.{kv}") for i in range(cfg.num_hidden_layers)
            for kv in ("key", "value")]


def quantize_bundle(forms, scheme, fp32: Path, prompts, prompt_ids: list[list[int]], new_tokens: int,
                    dst: Path) -> dict:
    """``fp32`` (the fp32 bundle's ``model.onnx``) quantized under ``genai_qdq_policy`` to ``dst`` (+ ``.data``),
    calibrated on GenAI's calls over ``prompt_ids`` (the prompts of the ``PromptSet`` ``prompts``); returns the
    manifest's record of what each tensor got."""
    policy = genai_qdq_policy(scheme)
    if policy is None:
        raise UnsupportedError(f"target onnx_genai: scheme {scheme.name} has no GenAI QDQ policy (only the decoder's "
                               "calibrated w8a16)")
    if not prompt_ids:
        raise CalibrationError("target onnx_genai: the w8a16 bundle calibrates on GenAI's calls over the calibration "
                               "prompts, and none were given")
    work = dst.parent / ".qdq-genai"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        src = work / "rewritten.onnx"
        matmul_as_conv(fp32, src, dynamic_rows=True)  # a new graph and data file beside it
        fuse_rmsnorm(src, src)  # the graph only: the norms' weights stay in src's data file
        ins, outs = forms.genai_specs(1, 1)
        part = QdqPart(Graph("genai", None, ins, outs), src, dst, policy, static_plan(src, policy, scheme.activations))
        part.calibrate(calibration_feeds(forms, prompt_ids, new_tokens), scheme)
        pairs = kv_pairs(forms.cfg)
        rhs = part.rhs_io()
        shared, record = shared_encodings([load_ranges(part.cache)], merge_groups(rhs + [list(p) for p in pairs]),
                                          scheme.activations, {t for grp in rhs for t in grp})
        with PartPool(1, None) as pool:
            part.submit(pool, (), scheme, shared)
        before = io_encodings(dst)
        write_outputs_in_input_encoding(dst, pairs)
        enc = io_encodings(dst)
        key = lambda e: (e["scale"], e["zero_point"], e["type"])  # noqa: E731
        requantized = [o for i, o in pairs if o in before and i in enc and key(before[o]) != key(enc[i])]
        return {"component_policy": {"genai": part.record()}, "shared_encodings": record,
                "kv_out_requantized": requantized, "float_nodes": len(part.plan.float_nodes),
                "activation_ranges": f"GenAI's calls over the {len(prompt_ids)} calibration prompts of set "
                                     f"{prompts.name} ({prompts.hash[:12]}; each prompt in one call, position 0, the "
                                     f"attention sink, included; then up to {new_tokens} greedy tokens one call each)",
                "io_encodings": enc}
    finally:
        shutil.rmtree(work, ignore_errors=True)
