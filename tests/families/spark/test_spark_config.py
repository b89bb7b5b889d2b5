"""Spark's config.json reader: every field implemented, informational or a one-line error naming it; sizes required."""
import pytest

from omni_export.errors import CheckpointError
from omni_export.families.spark.model import PRESETS, SparkConfig


@pytest.mark.parametrize("change, says", [
    (lambda d: d.pop("hidden_size"), "config.json has no hidden_size (required)"),
    (lambda d: d.update(hidden_size="big"), "hidden_size='big' must be a positive integer"),
    (lambda d: d.update(num_hidden_layers=5), "layer_types has 4 entries but num_hidden_layers is 5"),
    (lambda d: d.update(hidden_act="silu"), "hidden_act='silu' is not implemented by the spark family"),
    (lambda d: d.update(headwise_attn_output_gate=False), "headwise_attn_output_gate=False is not implemented"),
    (lambda d: d.update(use_sliding_window=True), "use_sliding_window=True is not implemented by the spark family"),
    (lambda d: d["rope_parameters"]["full_attention"].update(rope_type="yarn"), "only rope_theta and partial_rotary"),
    (lambda d: d.update(rms_norm_eps=float("nan")), "rms_norm_eps=nan must be a positive number"),
    (lambda d: d.update(rms_norm_eps=-1e-6), "rms_norm_eps=-1e-06 must be a positive number"),
])
def test_unimplemented_or_malformed_fields_are_one_line_errors(change, says):
    d = PRESETS["tiny"].to_hf()
    change(d)
    with pytest.raises(CheckpointError) as e:
        SparkConfig.from_hf(d)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_json_list_is_refused_and_informational_fields_are_accepted():
    with pytest.raises(CheckpointError, match="must be a JSON object"):
        SparkConfig.from_hf([1, 2])
    d = {**PRESETS["tiny"].to_hf(), "torch_dtype": "bfloat16", "architectures": ["Spark2_5ForCausalLM"]}
    assert SparkConfig.from_hf(d) == PRESETS["tiny"]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_nan_weights_are_refused_at_load_naming_the_tensor(tmp_path, value):
    from safetensors.torch import load_file, save_file

    from omni_export.commands.cli import main
    from omni_export.families import build_model
    ckpt = tmp_path / "ckpt"
    assert main(["checkpoint", str(ckpt)]) == 0
    (f,) = ckpt.glob("*.safetensors")
    state = load_file(f)
    # Finite values whose sum overflows float32 load (the check's fast path, a finite sum, does not hold for them).
    state["model.layers.0.mlp.down_proj.weight"][:4, 0] = 3e38
    save_file(state, f)
    build_model("spark", checkpoint=ckpt)
    state["model.layers.1.mlp.down_proj.weight"][3, 5] = value
    save_file(state, f)
    with pytest.raises(CheckpointError) as e:
        build_model("spark", checkpoint=ckpt)
    assert "tensor model.layers.1.mlp.down_proj.weight contains NaN or inf" in str(e.value)
