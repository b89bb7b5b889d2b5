"""The config.json fields every family accepts without implementing them, and the values that are another name for
one it implements: the one list, each entry with the reason it cannot change the function a model computes.

A family's config reader implements a field, accepts it because it is listed here, or refuses it in one line naming
it. ``tests/checkpoints/test_config_fields.py`` has one test per entry.
"""
from __future__ import annotations

ACCEPTED: dict[str, str] = {
    # provenance and packaging: where the config came from and how it was saved
    "architectures": "provenance: the transformers class that saved the config",
    "transformers_version": "provenance: the transformers version that saved the config",
    "_name_or_path": "provenance: the path or hub id transformers loaded the config from",
    "_model_name_or_path": "provenance: the GGUF file transformers' GGUF-to-config conversion read",
    "model_name": "provenance: a display name",
    "is_llama_config": "provenance: a marker older Llama conversions wrote",
    "transformers.js_config": "packaging: options for transformers.js, read by no PyTorch forward pass",
    "torch_dtype": "the dtype the weights were saved in; every tensor is upcast to fp32 on load (recorded as a note)",
    "dtype": "transformers >= 4.56's name of torch_dtype",
    # token ids: owned by the tokenizer and the generation config, read by no graph
    "bos_token_id": "a token id the tokenizer and generation loop use; no layer reads it",
    "eos_token_id": "a token id the tokenizer and generation loop use; no layer reads it",
    "pad_token_id": "a token id the tokenizer and generation loop use; no layer reads it",
    "unk_token_id": "a token id the tokenizer uses (transformers' GGUF-to-config conversion writes it); no layer reads it",
    # training-only or runtime switches
    "initializer_range": "training: the std of the random init; loaded weights replace it",
    "use_cache": "runtime switch of transformers' generate (the exported graphs take their caches as inputs)",
    "attention_dropout": "training: dropout is off at inference",
    "pretraining_tp": "the tensor-parallel degree of pre-training; transformers computes the same function for any value",
}

ALIASES: dict[str, dict[str, tuple[str, str]]] = {
    # field -> {value written: (the implemented value it names, why)}
    "hidden_act": {"swish": ("silu", "transformers' ACT2FN maps swish and silu to the same torch.nn.SiLU "
                                     "(x * sigmoid(x))")},
}


def canonical(field: str, value):
    """``value`` of ``field`` under the name the families implement (``swish`` -> ``silu``); others unchanged."""
    if isinstance(value, str) and value in ALIASES.get(field, {}):
        return ALIASES[field][value][0]
    return value
