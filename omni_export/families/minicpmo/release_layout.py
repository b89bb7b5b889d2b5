"""The released MiniCPM-o directory layout, written: ``save_release`` is the family's ``save_checkpoint`` (what
``omni-export checkpoint --family minicpmo`` writes), the inverse of ``official.load_official``."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
import torch.nn as nn
from safetensors.torch import save_file

from ...artifacts.atomic import atomic_dir
from ...errors import CheckpointError
from .checkpoint import official_state
from .official import IMPLEMENTED, RELEASED, TOKEN2WAV, flow_configs, hift_config, tts_config


def save_release(model: nn.Module, config, out) -> None:
    """Write ``model`` in the released MiniCPM-o layout that ``official.load_official`` reads (atomically):
    config.json with its ``tts_config``, the ``tts.*`` keys in model.safetensors, ``assets/token2wav/flow.pt`` and
    ``hift.pt`` (weight-normed as released). The layout carries the sizes (tts_config and the weights' shapes) but
    not the hyperparameters no weight holds, which the reader takes from the released model: a config that differs
    there is refused, except ``encoder.pe_rows``, which no module of this family reads (the reader sets the
    released value)."""
    off = official_state(model)
    tc = {"hidden_size": config.tts.hidden_size, "intermediate_size": config.tts.intermediate_size,
          "num_attention_heads": config.tts.num_attention_heads, "num_hidden_layers": config.tts.num_hidden_layers,
          "num_key_value_heads": config.tts.num_key_value_heads,
          "max_position_embeddings": config.tts.max_position_embeddings, "num_audio_tokens": config.num_audio_tokens,
          "num_text_tokens": config.text_vocab_size, "llm_dim": config.llm_hidden, **IMPLEMENTED}
    where = "minicpmo layout"
    enc, dit = flow_configs(off["flow"], where)
    read_back = dataclasses.replace(RELEASED, encoder=enc, dit=dit, hift=hift_config(off["hift"], where),
                                    **tts_config(tc, where, config.tts.vocab_size))
    want = dataclasses.replace(config, encoder=dataclasses.replace(config.encoder, pe_rows=RELEASED.encoder.pe_rows))
    if read_back != want:
        diff = next(f"{f.name}: {getattr(want, f.name)!r}" for f in dataclasses.fields(want)
                    if getattr(want, f.name) != getattr(read_back, f.name))
        raise CheckpointError(f"the minicpmo layout cannot carry this config ({diff[:160]}; the reader takes it "
                              f"from the released model)")
    with atomic_dir(Path(out)) as tmp:
        (tmp / "config.json").write_text(json.dumps({"model_type": "minicpmo", "tts_config": tc}, indent=2) + "\n")
        save_file({k: v.contiguous() for k, v in off["tts"].items()}, str(tmp / "model.safetensors"))
        (tmp / TOKEN2WAV).mkdir(parents=True)
        torch.save(off["flow"], tmp / TOKEN2WAV / "flow.pt")
        torch.save({f"generator.{k}": v for k, v in off["hift"].items()}, tmp / TOKEN2WAV / "hift.pt")
