"""fp32 weights mapped from safetensors files instead of copied into memory.

A parameter is a view of the file's pages (a private, copy-on-write mapping), so a model larger than the memory
budget is read only where it runs: exporting or running one part of a 2 B-parameter decoder touches that part's
pages only. ``release()`` drops the pages this process holds (they stay in the kernel's page cache, so touching
them again costs a page fault, not a disk read): a caller that works part by part releases between parts and its
resident set stays near one part's size.

The files mapped are exactly those the checked layout names (``hf.locate``: the index honoured, a key in two files
or a shard the index does not name refused, before anything is mapped): ``map_checkpoint``.

Full-size seeded models are written once as such a checkpoint (``seeded_checkpoint``), tensor by tensor with the
same generator sequence as the family's ``init_random``, so they are the same weights the in-memory path makes.
"""
from __future__ import annotations

import json
import mmap
import struct
import warnings
from pathlib import Path

import torch

from ..errors import CheckpointError
from .hf import locate

SHARD_BYTES = 1 << 30  # seeded checkpoints are written in shards of about 1 GiB (one shard in memory at a time)


def all_fp32(ckpt: Path) -> bool:
    """True when every tensor the checked layout of ``ckpt`` reads is fp32 (the files can be mapped as they are)."""
    _, _, info = locate(Path(ckpt))
    return all(dt == "F32" for dt, _ in info.values())


def map_checkpoint(ckpt: Path) -> "MappedWeights":
    """The fp32 tensors of a checked checkpoint directory, mapped (layout refusals as ``hf.open_hf``)."""
    files, _, _ = locate(Path(ckpt))
    return MappedWeights(files)


class MappedWeights:
    """Every fp32 tensor of some safetensors files, as read-only views of the mapped files (a key in two of them is
    refused)."""

    def __init__(self, files: list[Path]):
        self.maps: list[mmap.mmap] = []
        self.tensors: dict[str, torch.Tensor] = {}
        owner: dict[str, str] = {}
        for f in files:
            with open(f, "rb") as fh:
                try:
                    mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
                except ValueError:
                    raise CheckpointError(f"{Path(f).name} is empty") from None
            try:
                (n,) = struct.unpack("<Q", mm[:8])
                header = json.loads(mm[8:8 + n])
            except (struct.error, ValueError, UnicodeDecodeError):
                raise CheckpointError(f"{Path(f).name} is not a readable safetensors file") from None
            base = 8 + n
            for k, info in header.items():
                if k == "__metadata__":
                    continue
                if k in owner:
                    raise CheckpointError(f"key {k} is in both {owner[k]} and {Path(f).name}")
                owner[k] = Path(f).name
                if info["dtype"] != "F32":
                    raise CheckpointError(f"{Path(f).name}: tensor {k} is {info['dtype']}; only fp32 files are mapped")
                lo, hi = info["data_offsets"]
                if hi - lo == 0:
                    self.tensors[k] = torch.zeros(info["shape"])
                    continue
                if (base + lo) % 4:
                    raise CheckpointError(f"{Path(f).name}: tensor {k} is not 4-byte aligned")
                with warnings.catch_warnings():  # a private mapping is writable; torch warns for read-only buffers only
                    warnings.simplefilter("ignore")
                    t = torch.frombuffer(mm, dtype=torch.float32, count=(hi - lo) // 4, offset=base + lo)
                self.tensors[k] = t.view(info["shape"])
            self.maps.append(mm)

    def release(self) -> None:
        """Hand back every page this process has touched (they stay cached by the kernel)."""
        for mm in self.maps:
            mm.madvise(mmap.MADV_DONTNEED)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * 4 for t in self.tensors.values())


def fp32_bytes(module: torch.nn.Module) -> int:
    """Parameter bytes in fp32 (works on a meta-device module)."""
    return sum(p.numel() * 4 for p in module.parameters())


def seeded_checkpoint(out: Path, named_tensors, config: dict) -> list[Path]:
    """Write ``(name, tensor)`` pairs (a family's seeded generator) as ~1 GiB safetensors shards + config.json, atomically.
    A shard is written and hashed in a second thread while the generator makes the next one (the generator is
    single-threaded), so at most two shards are in memory at a time."""
    from concurrent.futures import ThreadPoolExecutor

    from safetensors.torch import save_file

    from ..artifacts.atomic import atomic_dir
    from ..artifacts.hashing import hash_file, hash_value

    def write(shard: dict, path: Path) -> str:
        save_file(shard, str(path))
        return hash_file(path)

    with atomic_dir(Path(out)) as tmp, ThreadPoolExecutor(1) as ex:
        shard, size, k, written = {}, 0, 0, []

        def flush():
            nonlocal shard, size, k
            if shard:
                if written:
                    written[-1][1].result()  # the shard before is on disk: at most two in memory
                name = f"model-{k:05d}.safetensors"
                written.append((name, ex.submit(write, shard, tmp / name)))
                shard, size, k = {}, 0, k + 1

        for name, t in named_tensors:
            if size + t.numel() * 4 > SHARD_BYTES:
                flush()
            shard[name] = t.float().contiguous()
            size += t.numel() * 4
        flush()
        hashes = {name: f.result() for name, f in written}
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (tmp / "weights_hash").write_text(hash_value(dict(sorted(hashes.items()))))  # = hash_files of the shards
    return locate(Path(out))[0]


def assign(module: torch.nn.Module, weights: MappedWeights, expected: dict[str, tuple[int, ...]]) -> torch.nn.Module:
    """Point a meta-device module's parameters at the mapped tensors (no copy); refuses missing or mis-shaped keys."""
    missing, unexpected = set(expected) - set(weights.tensors), set(weights.tensors) - set(expected)
    if missing:
        raise CheckpointError(f"checkpoint: missing keys: {', '.join(sorted(missing)[:4])}")
    if unexpected:
        raise CheckpointError(f"checkpoint: unexpected keys: {', '.join(sorted(unexpected)[:4])}")
    for k, shape in expected.items():
        if tuple(weights.tensors[k].shape) != tuple(shape):
            raise CheckpointError(f"key {k} has shape {tuple(weights.tensors[k].shape)}, expected {tuple(shape)}")
    module.load_state_dict({k: weights.tensors[k] for k in expected}, strict=False, assign=True)
    if hasattr(module, "tie_weights"):  # the Hugging Face convention: re-point tied heads at the assigned embedding
        module.tie_weights()
    meta = [n for n, p in list(module.named_parameters()) + list(module.named_buffers()) if p.is_meta]
    if meta:
        raise CheckpointError(f"mapped weights leave {len(meta)} tensor(s) unset, e.g. {meta[0]}")
    return module
