"""llama.cpp on its plain CPU buffers: llama-cpp-python's ``Llama`` made to load models with ``use_extra_bufts`` off.

The llama-cpp-python 0.3.36 build here offers AMX and repacked CPU weight buffers ("extra buffer types"); with them
every ``llama_decode`` ends in SIGSEGV on this machine (SmolLM2's and Gemma 3's GGUFs alike), with them off it runs
(``benchmarks/gemma3_llamacpp_witness.py`` measured Gemma 3 against our eager model this way). ``Llama`` exposes no
option for it, so its model-parameter defaults are wrapped once per process.
"""
from __future__ import annotations


def plain_cpu_buffers() -> None:
    import llama_cpp.llama_cpp as lib

    if getattr(lib.llama_model_default_params, "plain_cpu_buffers", False):
        return
    default = lib.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p
    params.plain_cpu_buffers = True
    lib.llama_model_default_params = params
