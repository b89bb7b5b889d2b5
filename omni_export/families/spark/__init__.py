"""The Spark-X2.5 family: the model (``model.py``), its prompt sets (``prompts/``) and its components, which are the
shared AR-1 decode step and AR-N prefill (``components.decoder_lm``): Spark follows the DecoderLM protocol."""
from __future__ import annotations

from pathlib import Path

from ...components.decoder_lm import DecodeStepComponent
from ...components.decoder_prefill import PrefillComponent
from .. import Family
from .model import PRESETS, SparkConfig, SparkForCausalLM, init_random, random_tensors

FAMILY = Family(
    name="spark",
    presets=PRESETS,
    config_from_hf=SparkConfig.from_hf,
    config_to_hf=SparkConfig.to_hf,
    build=SparkForCausalLM,
    init_random=init_random,
    random_tensors=random_tensors,
    expected_keys=lambda m: m.expected_keys(),
    components={"decode_step": DecodeStepComponent, "prefill": PrefillComponent},
    meta_init=True,
    prompts=Path(__file__).parent / "prompts",
)
