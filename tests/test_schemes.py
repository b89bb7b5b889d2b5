"""Schemes and QDQ policies are data: a policy refuses settings it cannot mean, records every setting, and the
decoder's policy goes to the schemes its properties name (never to the sweep's other w8a16 variants)."""
import dataclasses

import pytest

from omni_export.components.decoder_qdq import decoder_qdq_policy, genie_prompt_qdq_policy, genie_token_qdq_policy
from omni_export.schemes import SCHEMES, FloatOutliers, QdqPolicy, get_scheme


def test_a_policy_refuses_what_it_cannot_mean():
    with pytest.raises(ValueError, match="unknown float_ops \\['layernorm'\\]"):
        QdqPolicy("p", float_ops=("layernorm",))
    with pytest.raises(ValueError, match="weight_scales 'shared' and scales_from go together"):
        QdqPolicy("p", weight_scales="shared")
    with pytest.raises(ValueError, match="weight_scales 'percentile'"):
        QdqPolicy("p", weight_scales="percentile")
    with pytest.raises(ValueError, match="range_margin 0.5 narrows"):
        QdqPolicy("p", range_margin=0.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        QdqPolicy("p").range_margin = 2.0


def test_the_record_holds_every_setting_and_why():
    p = QdqPolicy("p", int16_weights=("a.weight",), float_ops=("rmsnorm",),
                  float_outliers=FloatOutliers("down", 10.0), shared_kv=True, why={"norm": "because"})
    rec = p.to_record()
    assert rec["policy"] == "p" and rec["norm"] == "because"
    assert set(rec["settings"]) == {f.name for f in dataclasses.fields(QdqPolicy)} - {"name", "why"}
    assert rec["settings"]["float_outliers"] == {"match": "down", "factor": 10.0, "with_input": False}
    assert rec["settings"]["int16_weights"] == ["a.weight"] and p.needs_ranges


def test_the_decoder_policy_goes_to_the_schemes_its_properties_name():
    got = {name for name, s in SCHEMES.items() if decoder_qdq_policy(s, prefill=False) is not None}
    assert got == {"w8a16", "w8a16_mixed"}
    step, prefill = decoder_qdq_policy(get_scheme("w8a16"), False), decoder_qdq_policy(get_scheme("w8a16"), True)
    assert step.range_margin == 2.0 and not step.float_ops and step.float_outliers is None
    assert prefill.range_margin == 1.0 and prefill.float_ops == ("rmsnorm", "residual_add") and prefill.float_outliers
    # Genie's two programs: the decode step's weights, the residual stream's ops float in both (one set of weight
    # encodings); the prompt processor on its own ranges, no margin
    token, prompt = genie_token_qdq_policy(get_scheme("w8a16")), genie_prompt_qdq_policy(get_scheme("w8a16"))
    assert token.float_ops == prompt.float_ops == ("rmsnorm", "residual_add")
    assert dataclasses.replace(token, name=step.name, float_ops=(), why=step.why) == step
    assert dataclasses.replace(prompt, name=token.name, range_margin=token.range_margin, why=token.why) == token
    assert "activation_range_margin" not in prompt.why and "activation_ranges" in prompt.why
    assert genie_token_qdq_policy(get_scheme("w8a8")) is None


def test_targets_dispatch_on_properties_that_name_the_same_schemes_as_before():
    by = {prop: {n for n, s in SCHEMES.items() if getattr(s, prop)} for prop in ("half", "dynamic_activations",
                                                                                    "weight_only")}
    assert by == {"half": {"fp16"}, "dynamic_activations": {"w8a8_dynamic", "w4a8_dynamic"},
                  "weight_only": {"int8_weight_only_torchao", "w8_fp16", "w8_block32"}}
