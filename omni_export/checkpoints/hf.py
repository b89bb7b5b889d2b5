"""Hugging Face checkpoint directories: config.json + one or several *.safetensors files, optionally indexed by
``model.safetensors.index.json``.

With an index, exactly the files it names are read and every key must sit in the file the index names; a key found
in two files, a ``*.safetensors`` file the index does not name, a key the index names that its file lacks, or a
named file that is missing is a one-line error. Without an index every ``*.safetensors`` file is read and a key in
two of them is refused. fp32, bf16 and fp16 tensors are upcast to fp32 one at a time (``safe_open``), so a checkpoint
never has to be resident as a whole.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch

from ..artifacts.hashing import hash_files
from ..errors import CheckpointError
from .tokenizer import Tokenizer

INDEX = "model.safetensors.index.json"
DTYPES = {"F32": "fp32", "BF16": "bf16", "F16": "fp16"}


def _json_object(path: Path) -> dict:
    where = f"{path.parent.name}/{path.name}"
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{where} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{where} is a JSON {type(value).__name__}, not an object")
    return value


def read_config(ckpt: Path) -> dict:
    cfg = Path(ckpt) / "config.json"
    if not cfg.is_file():
        raise CheckpointError(f"checkpoint {Path(ckpt).name} has no config.json")
    return _json_object(cfg)


def _header(f: Path) -> dict[str, tuple[str, tuple]]:
    """key -> (safetensors dtype, shape) of one file, from its header only."""
    from safetensors import safe_open

    try:
        with safe_open(str(f), framework="pt") as h:
            out = {}
            for k in h.keys():
                s = h.get_slice(k)
                out[k] = (s.get_dtype(), tuple(int(d) for d in s.get_shape()))
            return out
    except Exception as e:  # safetensors raises several types for a corrupt header
        raise CheckpointError(f"{f.name} is not a readable safetensors file: {str(e).splitlines()[0]}") from None


def _index(ckpt: Path) -> dict[str, str]:
    wm = _json_object(ckpt / INDEX).get("weight_map")
    if not isinstance(wm, dict) or not wm:
        raise CheckpointError(f"{INDEX} has no weight_map object")
    for k, v in wm.items():
        if not isinstance(v, str) or Path(v).name != v or not v.endswith(".safetensors"):
            raise CheckpointError(f"{INDEX}: key {k} maps to {v!r}, not a .safetensors file name in the directory")
    return wm


def _locate(ckpt: Path) -> tuple[list[Path], dict[str, Path], dict[str, tuple[str, tuple]]]:
    """(files read, key -> file, key -> (dtype, shape)) with every layout check applied."""
    present = sorted(ckpt.glob("*.safetensors"))
    if (ckpt / INDEX).is_file():
        wm = _index(ckpt)
        named = sorted(set(wm.values()))
        for name in named:
            if not (ckpt / name).is_file():
                key = next(k for k, v in wm.items() if v == name)
                raise CheckpointError(f"{INDEX} names shard {name} (key {key}), which is missing")
        stale = [f.name for f in present if f.name not in named]
        if stale:
            raise CheckpointError(f"{ckpt.name}: shard {stale[0]} lies next to {INDEX}, which does not name it "
                                  f"(stale or foreign shard)")
        files = [ckpt / n for n in named]
    else:
        if not present:
            other = sorted(p.name for p in ckpt.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".gguf"))
            extra = f" ({other[0]} is not read: only safetensors)" if other else ""
            raise CheckpointError(f"checkpoint {ckpt.name} has no *.safetensors files{extra}")
        wm, files = None, present
    where, info = {}, {}
    for f in files:
        for k, (dt, shape) in _header(f).items():
            if k in where:
                raise CheckpointError(f"{ckpt.name}: key {k} is in both {where[k].name} and {f.name}")
            if wm is not None and wm.get(k) != f.name:
                said = f"in {wm[k]}" if k in wm else "nowhere"
                raise CheckpointError(f"{f.name}: key {k} is not where {INDEX} puts it ({said})")
            if dt not in DTYPES:
                raise CheckpointError(f"{f.name}: key {k} has dtype {dt}; supported: F32, BF16, F16")
            where[k], info[k] = f, (dt, shape)
    if wm is not None:
        lacking = sorted(set(wm) - set(where))
        if lacking:
            raise CheckpointError(f"{wm[lacking[0]]}: lacks key {lacking[0]} that {INDEX} names")
    return files, where, info


def _special_id(backend, value, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, dict):
        value = value.get("content")
    if not isinstance(value, str):
        raise CheckpointError(f"{where}: special token {value!r} is not a string")
    i = backend.token_to_id(value)
    if i is None:
        raise CheckpointError(f"{where}: special token {value!r} is not in the tokenizer's vocabulary")
    return i


def _config_id(config: dict, key: str) -> int | None:
    v = config.get(key)
    if isinstance(v, list):  # several eos ids (e.g. Llama 3): the first is the one generation appends
        v = v[0] if v else None
    if v is not None and not isinstance(v, int):
        raise CheckpointError(f"config.json: {key} {v!r} is not an integer")
    return v


def tokenizer_from_dir(ckpt: Path, config: dict) -> Tokenizer | None:
    """``tokenizer.json`` of a Hugging Face directory (None if there is none); bos/eos from tokenizer_config.json,
    else from config.json."""
    from tokenizers import Tokenizer as Backend

    path = Path(ckpt) / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        backend = Backend.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception for a malformed file
        raise CheckpointError(f"{path.name} is not a readable tokenizers file: {str(e).splitlines()[0]}") from None
    bos, eos = _config_id(config, "bos_token_id"), _config_id(config, "eos_token_id")
    tc = Path(ckpt) / "tokenizer_config.json"
    if tc.is_file():
        tcfg = _json_object(tc)
        if tcfg.get("bos_token") is not None:
            bos = _special_id(backend, tcfg["bos_token"], tc.name)
        if tcfg.get("eos_token") is not None:
            eos = _special_id(backend, tcfg["eos_token"], tc.name)
    return Tokenizer(f"{Path(ckpt).name}/tokenizer.json", backend, bos, eos)


class _HFReader:
    def __init__(self, where: dict[str, Path]):
        self.where = where

    def tensor(self, key: str) -> torch.Tensor:
        from safetensors import safe_open

        f = self.where[key]
        try:
            with safe_open(str(f), framework="pt") as h:
                t = h.get_tensor(key)
        except Exception as e:
            raise CheckpointError(f"{f.name}: cannot read tensor {key}: {str(e).splitlines()[0]}") from None
        return t.to(torch.float32)

    def close(self) -> None:
        self.where = {}


def open_hf(ckpt: Path):
    from .base import Checkpoint

    ckpt = Path(ckpt)
    config = read_config(ckpt)
    files, where, info = _locate(ckpt)
    dtypes = Counter(DTYPES[dt] for dt, _ in info.values())
    tokenizer = tokenizer_from_dir(ckpt, config)
    notes = [f"{d} weights upcast to fp32 (exact)" for d in sorted(dtypes) if d != "fp32"]
    if tokenizer is None:
        have = [n for n in ("tokenizer.model", "vocab.json") if (ckpt / n).is_file()]
        notes.append(f"no tokenizer.json ({have[0]} is not read)" if have else "the checkpoint has no tokenizer")
    if config.get("tie_word_embeddings") and "lm_head.weight" in where:
        notes.append("lm_head.weight is saved although tie_word_embeddings is set")
    shards = f"{len(files)} shard{'s' if len(files) > 1 else ''}" + (", indexed" if (ckpt / INDEX).is_file() else "")
    return Checkpoint(config=config, keys={k: s for k, (_, s) in info.items()},
                      weights_hash=hash_files({f.name: f for f in files}), tokenizer=tokenizer,
                      source=f"hf safetensors, {shards}, {'+'.join(d for d, _ in dtypes.most_common())}",
                      notes=tuple(notes), _reader=_HFReader(where))
