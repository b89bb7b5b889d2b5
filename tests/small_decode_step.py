"""A two-layer Spark decode step (a small checkpoint written on the fly), exported once with the Linear -> 1x1 Conv
rewrite, with a calibration set of every captured step (a 24-sample subset missed activation extremes of later
positions and cost 13 dB on the K/V rows): quick enough to quantize several times in one test. The ``small``
fixture of ``tests/conftest.py`` (the calibration and quantization tests) builds it."""
from dataclasses import dataclass

from omni_export.calibration.dataset import CalibrationSet, write_set
from omni_export.families import load_prompt_set
from omni_export.lowering.onnx_export import export_onnx
from omni_export.blocks.graph_forms import linear_to_conv
from omni_export.families import build_model
from omni_export.checkpoints.hf import save_hf
from omni_export.families.spark.model import SparkConfig, SparkForCausalLM, init_random

SMALL = SparkConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                    num_key_value_heads=1, head_dim=32, sliding_window=8, vocab_size=300, max_position_embeddings=64,
                    layer_types=("sliding_attention", "full_attention"))


@dataclass
class Small:
    comp: object
    graph: object
    src: object          # the rewritten fp32 ONNX graph
    calibration: CalibrationSet
    dir: object
    trace_set: tuple     # (calibration prompts, opts): what the mixed-precision search drives candidates over


def build_small(tmp_path_factory) -> Small:
    d = tmp_path_factory.mktemp("small")
    lm = init_random(SparkForCausalLM(SMALL), 0)
    save_hf({k: v for k, v in lm.state_dict().items() if k in lm.expected_keys()}, SMALL.to_hf(), d / "ckpt")
    bundle = build_model("spark", checkpoint=d / "ckpt")
    comp = bundle.family.components["decode_step"](bundle, context=32)
    g = comp.graphs()[0]
    src = export_onnx(linear_to_conv(g.module), g, d / "rewritten.onnx")
    prompts = load_prompt_set("spark_calibration")
    opts = {"max_prompt_tokens": 12, "new_tokens": 8}
    (d / "cal").mkdir()
    cs = write_set(d / "cal", comp.calibration_feeds(prompts, opts), comp.calibration_steps(prompts, opts), 256,
                   prompts.name, prompts.hash)
    return Small(comp, g, src, cs, d, (prompts, opts))
