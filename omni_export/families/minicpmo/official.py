"""The released MiniCPM-o 4.5 directory as a ``minicpmo`` checkpoint: ``config.json`` (its ``tts_config``), the
safetensors shards (only the ``tts.`` keys are the speech path; an index is honoured as for every HF directory) and
``assets/token2wav/flow.pt`` + ``hift.pt`` (PyTorch state dicts, read with ``weights_only``).

Every ``tts_config`` field is accounted for: the sizes map onto the TTS head's Llama config, the fields whose value
fixes what the graphs compute must have the value this family implements, the host loop's scheduling and sampling
fields and the training-only fields are accepted as such (they change no exported graph), and any other field is a
one-line error naming it. The flow and HiFT sizes are read from their weights' shapes (``flow.yaml`` is a
HyperPyYAML file of Python constructors and is not executed); their hyperparameters that no weight carries (HiFT's
upsample strides and dilations, the hop, the NSF constants, the encoder's upsample stride) are the released
model's (``config.PRESETS["4.5"]``), and every key and shape is then checked by ``checkpoint.split_state``.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import torch

from ...artifacts.hashing import hash_files, hash_value
from ...checkpoints.hf import open_hf
from ...errors import CheckpointError
from ..llama.config import LlamaConfig
from .checkpoint import V, split_state
from .config import AUDIO_BOS, PRESETS, TEXT_EOS, DiTConfig, EncoderConfig, HiFTConfig, MiniCPMOConfig

TOKEN2WAV = Path("assets") / "token2wav"
# the omni model's other modules in the same shards: not the speech path, not read; a key under any other prefix
# is an error (a foreign or renamed module must not pass unnoticed)
OTHER_MODULES = ("llm.", "vpm.", "apm.", "resampler.", "audio_projection_layer.", "audio_avg_pooler.")
RELEASED = PRESETS["4.5"]

SIZES = {"hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "num_key_value_heads",
         "max_position_embeddings", "num_audio_tokens", "num_text_tokens", "llm_dim"}
# the value each of these must have: what the exported graphs and their host loop compute
IMPLEMENTED = {"num_vq": 1, "hidden_act": "silu", "projector_type": "mlp", "condition_type": "hidden_text_merge",
               "backbone_model": "llama", "normalize_projected_hidden": True, "llm_down_scale": False,
               "audio_bos_token_id": AUDIO_BOS, "text_eos_token_id": TEXT_EOS,
               "audio_tokenizer_type": "s3tokenizer_step_audio", "audio_tokenizer_sample_rate": 24000,
               "s3_stream_chunk_size": RELEASED.chunk_tokens, "s3_stream_n_timesteps": RELEASED.n_timesteps,
               "s3_stream_prelook_size": RELEASED.encoder.pre_lookahead_len, "model_type": "minicpmtts"}
# ``MiniCPMTTSConfig``'s defaults that differ from what this family implements: a config that leaves one of these out
# means that default, so it must name the value
CLASS_DEFAULTS = {"condition_type": "llm_hidden", "normalize_projected_hidden": False, "audio_bos_token_id": 21132,
                  "text_eos_token_id": 21133, "audio_tokenizer_type": "wavtokenizer"}
# the host loop's text/audio interleaving and sampling policy: no exported graph depends on them
HOST_POLICY = {"streaming", "streaming_text_chunk_min", "streaming_text_chunk_max", "streaming_text_reserved_len",
               "streaming_audio_chunk_size", "streaming_sliding_window", "streaming_sliding_window_max_text_len",
               "streaming_sliding_window_average_speed", "streaming_sliding_window_fast_speed",
               "streaming_sliding_window_slow_speed", "streaming_sliding_window_audio_frame_rate",
               "streaming_sliding_window_audio_init_text_length", "streaming_sliding_window_audio_window_size",
               "attention_type", "recomputed_chunks", "window_size", "interleaved", "s3_stream_generate",
               "use_text", "use_llm_hidden_state", "temperature", "top_k", "top_p", "repetition_penalty",
               "min_new_tokens", "max_new_tokens", "seed", "attn_implementation"}
# training losses, the unused LLM-side projector options and the older mel vocoder's bins; HF serialization metadata
TRAINING_OR_METADATA = {"aug_loss_weight", "aug_layer_loss_weight", "filter_tts_loss", "tts_filter_loss_fix",
                        "long_weight", "short_weight", "llm_intermediate_size", "llm_dim_model_base", "num_mel_bins",
                        "transformers_version", "_name_or_path", "architectures", "torch_dtype", "dtype"}


def tts_config(tc: dict, where: str, backbone_vocab: int) -> dict:
    """The TTS head's sizes from ``tts_config``; every other field checked, accepted as host or training, or refused."""
    if not isinstance(tc, dict):
        raise CheckpointError(f"{where}: config.json has no tts_config object (not a MiniCPM-o speech checkpoint)")
    for k, v in tc.items():
        if k in IMPLEMENTED and v != IMPLEMENTED[k]:
            raise CheckpointError(f"{where}: tts_config {k}={v!r} is not implemented by the minicpmo family "
                                  f"(it implements {IMPLEMENTED[k]!r})")
        if k not in SIZES | IMPLEMENTED.keys() | HOST_POLICY | TRAINING_OR_METADATA:
            raise CheckpointError(f"{where}: tts_config field {k}={v!r} is not implemented by the minicpmo family")
    missing = sorted(SIZES - tc.keys())
    if missing:
        raise CheckpointError(f"{where}: tts_config lacks {missing[0]}")
    for k, default in CLASS_DEFAULTS.items():
        if k not in tc:
            raise CheckpointError(f"{where}: tts_config lacks {k} (MiniCPMTTSConfig's default {default!r} is not "
                                  f"implemented by the minicpmo family: it implements {IMPLEMENTED[k]!r})")
    llama = LlamaConfig(hidden_size=tc["hidden_size"], intermediate_size=tc["intermediate_size"],
                        num_hidden_layers=tc["num_hidden_layers"], num_attention_heads=tc["num_attention_heads"],
                        num_key_value_heads=tc["num_key_value_heads"], vocab_size=backbone_vocab,
                        max_position_embeddings=tc["max_position_embeddings"], rms_norm_eps=RELEASED.tts.rms_norm_eps,
                        rope_theta=RELEASED.tts.rope_theta)
    return {"tts": llama, "text_vocab_size": tc["num_text_tokens"], "llm_hidden": tc["llm_dim"],
            "num_audio_tokens": tc["num_audio_tokens"]}


def _shape(state: dict, key: str, where: str) -> tuple[int, ...]:
    t = state.get(key)
    if t is None and key.endswith(".weight"):
        t = state.get(key[: -len(".weight")] + V)  # a weight-normed conv: the direction tensor has the weight's shape
    if t is None:
        raise CheckpointError(f"{where}: missing key {key}")
    return tuple(t.shape)


def _count(state: dict, prefix: str) -> int:
    return len({m.group(1) for k in state if (m := re.match(re.escape(prefix) + r"(\d+)\.", k))})


def flow_configs(flow: dict, where: str) -> tuple[EncoderConfig, DiTConfig]:
    s = lambda k: _shape(flow, k, where)  # noqa: E731
    e = "encoder.encoders.0."
    enc = dataclasses.replace(
        RELEASED.encoder, vocab_size=s("input_embedding.weight")[0], hidden=s("encoder.embed.out.0.weight")[0],
        heads=s(e + "self_attn.pos_bias_u")[0], linear_units=s(e + "feed_forward.w_1.weight")[0],
        num_blocks=_count(flow, "encoder.encoders."), num_up_blocks=_count(flow, "encoder.up_encoders."),
        pre_lookahead_len=s("encoder.pre_lookahead_layer.conv1.weight")[2] - 1,
        spk_embed_dim=s("spk_embed_affine_layer.weight")[1], mel=s("encoder_proj.weight")[0])
    d = "decoder.estimator."
    hidden, head_dim = s(d + "in_proj.weight")[0], s(d + "blocks.0.attn.q_norm.weight")[0]
    dit = dataclasses.replace(
        RELEASED.dit, in_channels=s(d + "in_proj.weight")[1], out_channels=s(d + "final_layer.linear.weight")[0],
        hidden=hidden, depth=_count(flow, d + "blocks."), heads=hidden // head_dim, head_dim=head_dim,
        mlp_ratio=s(d + "blocks.0.mlp.fc1.weight")[0] / hidden, freq_dim=s(d + "t_embedder.mlp.0.weight")[1])
    return enc, dit


def hift_config(hift: dict, where: str) -> HiFTConfig:
    s = lambda k: _shape(hift, k, where)  # noqa: E731
    n_up = _count(hift, "ups.")
    return dataclasses.replace(
        RELEASED.hift, mel=s("conv_pre.weight")[1], base_channels=s("conv_pre.weight")[0],
        nb_harmonics=s("m_source.l_linear.weight")[1] - 1, n_fft=s("conv_post.weight")[0] - 2,
        upsample_kernel_sizes=tuple(s(f"ups.{i}.weight")[2] for i in range(n_up)),
        upsample_rates=RELEASED.hift.upsample_rates[:n_up],
        resblock_kernel_sizes=tuple(s(f"resblocks.{i}.convs1.0.weight")[2]
                                    for i in range(len(RELEASED.hift.resblock_kernel_sizes))),
        source_resblock_kernel_sizes=tuple(s(f"source_resblocks.{i}.convs1.0.weight")[2] for i in range(n_up)),
        f0_channels=s("f0_predictor.condnet.0.weight")[0])


def _torch_state(path: Path, where: str) -> dict:
    if not path.is_file():
        raise CheckpointError(f"{where}: {path.relative_to(path.parents[2])} is missing")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - a pickle that is not a plain state dict, or a corrupt file
        raise CheckpointError(f"{where}: {path.name} is not a readable state dict: {str(e).splitlines()[0][:200]}") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{where}: {path.name} is not a flat state dict of tensors")
    return state


def load_official(ckpt: Path):
    """-> (config, state dict, weights hash, notes) from a released MiniCPM-o 4.5 directory."""
    from .model import MiniCPMOSpeech

    ckpt, where = Path(ckpt), f"checkpoint {Path(ckpt).name}"
    if not ckpt.is_dir():
        raise CheckpointError(f"{where} is not a directory (the released MiniCPM-o layout)")
    with open_hf(ckpt) as hf:
        foreign = sorted(k for k in hf.keys if not k.startswith(("tts.", *OTHER_MODULES)))
        if foreign:
            raise CheckpointError(f"{where}: key {foreign[0]} belongs to no module of MiniCPM-o "
                                  f"(speech path tts.*; not read: {', '.join(OTHER_MODULES)})")
        tts_keys = [k for k in hf.keys if k.startswith("tts.")]
        if not tts_keys:
            raise CheckpointError(f"{where}: no tts.* keys in its safetensors (not a MiniCPM-o speech checkpoint)")
        backbone = hf.keys.get("tts.model.embed_tokens.weight")
        if backbone is None:
            raise CheckpointError(f"{where}: missing key tts.model.embed_tokens.weight")
        tts = tts_config(hf.config.get("tts_config"), where, backbone[0])
        tts_state = {k: hf.tensor(k) for k in tts_keys}
        weights = hf.weights_hash
    flow = _torch_state(ckpt / TOKEN2WAV / "flow.pt", where)
    hift = _torch_state(ckpt / TOKEN2WAV / "hift.pt", where)
    if hift and all(k.startswith("generator.") for k in hift):
        hift = {k[len("generator."):]: v for k, v in hift.items()}
    enc, dit = flow_configs(flow, where)
    cfg = dataclasses.replace(RELEASED, encoder=enc, dit=dit, hift=hift_config(hift, where), **tts)
    with torch.device("meta"):
        model = MiniCPMOSpeech(cfg)
    state = split_state(model, {"tts": tts_state, "flow": flow, "hift": hift})
    files = {p.name: p for p in (ckpt / TOKEN2WAV / "flow.pt", ckpt / TOKEN2WAV / "hift.pt")}
    return cfg, state, hash_value([weights, hash_files(files)]), ()

