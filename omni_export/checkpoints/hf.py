"""Hugging Face checkpoint directories: config.json + one or several *.safetensors files, optionally indexed by
``model.safetensors.index.json``.

With an index, exactly the files it names are read and every key must sit in the file the index names; a key found
in two files, a ``*.safetensors`` file the index does not name, a key the index names that its file lacks, or a
named file that is missing is a one-line error. Without an index every ``*.safetensors`` file is read and a key in
two of them is refused. fp32, bf16 and fp16 tensors are upcast to fp32 one at a time (``safe_open``), so a checkpoint
never has to be resident as a whole.

Every family reads its safetensors through this module (``open_hf``, ``load_state_dict``, ``checkpoint_hash``, and
``mapped.map_checkpoint`` for the mapped path), so every layout check above holds for all of them, and is applied
from the headers alone, before any tensor is read. ``save_hf`` is the one writer of such a directory.
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
    if not Path(ckpt).is_dir():
        raise CheckpointError(f"checkpoint {ckpt} is not a directory")
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


def locate(ckpt: Path) -> tuple[list[Path], dict[str, Path], dict[str, tuple[str, tuple]]]:
    """(files read, key -> file, key -> (dtype, shape)) with every layout check applied (headers only)."""
    ckpt = Path(ckpt)
    if not ckpt.is_dir():
        raise CheckpointError(f"checkpoint {ckpt} is not a directory")
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
    files, where, info = locate(ckpt)
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


def _list(names, n=4) -> str:
    names = sorted(names)
    return ", ".join(names[:n]) + (f" (+{len(names) - n} more)" if len(names) > n else "")


def check_keys(name: str, keys: dict[str, tuple], expected: dict[str, tuple], ignore_prefixes: tuple[str, ...] = ()) -> None:
    """Refuse (one line) missing, unexpected or mis-shaped keys; keys under ``ignore_prefixes`` are not the model's
    (e.g. a Base model's speaker encoder) and are not read."""
    present = {k for k in keys if not k.startswith(ignore_prefixes)}
    missing = set(expected) - present
    unexpected = present - set(expected)
    if missing:
        raise CheckpointError(f"checkpoint {name}: missing keys: {_list(missing)}")
    if unexpected:
        raise CheckpointError(f"checkpoint {name}: unexpected keys: {_list(unexpected)}")
    for k in sorted(present):
        if tuple(keys[k]) != tuple(expected[k]):
            raise CheckpointError(f"checkpoint {name}: key {k} has shape {tuple(keys[k])}, expected {tuple(expected[k])}")


def load_state_dict(ckpt: Path, expected: dict[str, tuple[int, ...]],
                    ignore_prefixes: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """Every expected tensor of a checked directory as fp32; missing, unexpected or mis-shaped keys are refused
    (from the headers, before any tensor is read)."""
    ckpt = Path(ckpt)
    _, where, info = locate(ckpt)
    check_keys(ckpt.name, {k: s for k, (_, s) in info.items()}, expected, ignore_prefixes)
    reader, out = _HFReader(where), {}
    for k in sorted(set(expected) & set(where)):
        out[k] = reader.tensor(k)
    return out


def checkpoint_hash(ckpt: Path) -> str:
    """The hash of the files the checked layout reads (names and contents): ``open_hf(ckpt).weights_hash``."""
    files, _, _ = locate(Path(ckpt))
    return hash_files({f.name: f for f in files})


def save_hf(state: dict[str, torch.Tensor], config: dict, ckpt: Path) -> None:
    """Write config.json + model.safetensors atomically (the directory appears whole or not at all)."""
    from ..artifacts.atomic import atomic_dir

    with atomic_dir(Path(ckpt)) as tmp:
        write_hf(state, config, tmp)


def write_hf(state: dict[str, torch.Tensor], config: dict, directory: Path) -> None:
    """config.json + model.safetensors into an existing directory (the caller makes it atomic)."""
    from safetensors.torch import save_file

    (Path(directory) / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file({k: v.detach().contiguous() for k, v in state.items()}, str(Path(directory) / "model.safetensors"))
