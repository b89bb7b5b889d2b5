"""A two-layer Spark checkpoint (one sliding, one full layer; written on the fly) and a recipe over it, so each
new target runs through the real pipeline, runtimes and gate in seconds rather than minutes."""
from importlib import resources

import pytest
import yaml

from omni_export.checkpoints.hf import save_hf
from omni_export.families.spark.model import SparkConfig, SparkForCausalLM, init_random
from omni_export.recipes import parse_recipe

SMALL = SparkConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                    num_key_value_heads=1, head_dim=32, sliding_window=8, vocab_size=300, max_position_embeddings=64,
                    layer_types=("sliding_attention", "full_attention"))


@pytest.fixture(scope="session")
def small_ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("small_ckpt") / "ckpt"
    lm = init_random(SparkForCausalLM(SMALL), 0)
    save_hf({k: v for k, v in lm.state_dict().items() if k in lm.expected_keys()}, SMALL.to_hf(), d)
    return d


@pytest.fixture
def small_recipe(small_ckpt):
    """``small_recipe(shipped_name)``: that shipped recipe's builds and thresholds over the two-layer checkpoint,
    a context of 32 and short parity runs."""
    def make(shipped: str, **over):
        d = yaml.safe_load(resources.files("omni_export.recipes").joinpath(f"{shipped}.yaml").read_text())
        d.update(model={"family": "spark", "preset": None, "seed": 0, "checkpoint": str(small_ckpt)}, context=32,
                 prompts={**d["prompts"], "max_prompt_tokens": 12}, parity={"new_tokens": 8, "simulator_steps": 40})
        d.update(over)
        return parse_recipe(d, f"{shipped} (two-layer test checkpoint)")
    return make
