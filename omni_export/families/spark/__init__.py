"""The Spark-X2.5 family: the model (``model.py``), its prompt sets (``prompts/``) and its components, which are the
shared AR-1 decode step and AR-N prefill (``components.decoder_lm``): Spark follows the DecoderLM protocol."""
from __future__ import annotations

from ...components.decoder_lm import DecodeStepComponent
from ...components.decoder_prefill import PrefillComponent
from .. import Family
from .model import PRESETS, SparkConfig, SparkForCausalLM, init_random, random_tensors

FAMILY = Family.declare("spark", SparkConfig, SparkForCausalLM, __file__, presets=PRESETS, init_random=init_random,
                        random_tensors=random_tensors, meta_init=True,
                        components={"decode_step": DecodeStepComponent, "prefill": PrefillComponent})
