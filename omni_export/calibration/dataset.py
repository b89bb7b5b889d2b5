"""Calibration sets: graph inputs captured by running the fp32 pipeline, stored one sample per file with a
content hash that every artifact's manifest references. Samples stream from disk, so memory stays bounded.

An input may be stored as ``Rows``: gathered from a pool of rows the set holds once (a decode step's KV caches are
the rows earlier steps wrote, so a sample stores 128 row indices instead of 128 rows: SmolLM2's 1,024-sample set is
~0.2 GB instead of 5.8 GB). A sample reads back as the full arrays, identical to storing them."""
from __future__ import annotations

import ast
import functools
import io
import json
import math
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from ..artifacts.hashing import hash_tensors, hash_value
from ..components.base import Rows
from ..errors import CalibrationError

INDEX = "index.json"
POOL_DIR = "pools"
NPY_MAGIC = b"\x93NUMPY"


@functools.lru_cache(maxsize=4096)
def _npy_header(raw: bytes) -> tuple[np.dtype, tuple[int, ...], bool]:
    h = ast.literal_eval(raw.decode("latin1"))
    return np.dtype(h["descr"]), tuple(h["shape"]), bool(h["fortran_order"])


def read_sample(path: Path) -> dict[str, np.ndarray]:
    """A sample file (``np.savez``: uncompressed .npy members) as {name: array}, the arrays ``np.load`` gives. A
    sample holds ~190 small arrays (a decode step's row indices, pools and axes per cache input), and numpy parses
    each member's header with ``ast.literal_eval``: most of reading SmolLM2's 1,024-sample set twice per export.
    Headers repeat from sample to sample, so each distinct one is parsed once here, and the file is read in one call,
    each member's bytes sliced from it where its local header says (``_stored_members``; its CRC-32 checked as
    ``zipfile`` checks it) instead of one ``zipfile`` member read each. Anything but a plain uncompressed array
    member is read by ``np.load`` as before."""
    out = {}
    raw = path.read_bytes()
    with zipfile.ZipFile(io.BytesIO(raw)) as z:
        members = _stored_members(z, raw)
        if members is None:
            return _np_load(path)
        for name, data in members:
            if not name.endswith(".npy") or data[:6] != NPY_MAGIC or data[6] not in (1, 2, 3):
                return _np_load(path)
            size = 2 if data[6] == 1 else 4
            start = 8 + size
            end = start + int.from_bytes(data[8:start], "little")
            dtype, shape, fortran = _npy_header(bytes(data[start:end]))
            if dtype.hasobject:
                return _np_load(path)
            a = np.frombuffer(data, dtype, count=math.prod(shape), offset=end)
            out[name[:-4]] = a.reshape(shape, order="F" if fortran else "C")
    return out


_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # zipfile's local file header (30 bytes)


def _stored_members(z: zipfile.ZipFile, raw: bytes) -> list[tuple[str, bytearray]] | None:
    """``(name, bytes)`` of every member of ``z`` (opened on ``raw``), each its own writable copy as ``z.read`` gives
    it, sliced from ``raw`` at the offset its local header gives; a CRC-32 that does not match raises
    ``zipfile.BadZipFile`` as ``z.read`` does. None when a member is compressed or encrypted or its local header is
    not the plain one (then ``np.load`` reads the file)."""
    view, out = memoryview(raw), []
    for info in z.infolist():
        if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
            return None
        off = info.header_offset
        if off + _LOCAL_HEADER.size > len(raw):
            return None
        head = _LOCAL_HEADER.unpack_from(raw, off)
        n_name, n_extra = head[-2], head[-1]
        if head[0] != b"PK\x03\x04" or raw[off + 30:off + 30 + n_name] != info.orig_filename.encode(
                "utf-8" if info.flag_bits & 0x800 else "cp437"):
            return None
        start = off + 30 + n_name + n_extra
        if start + info.compress_size > len(raw):
            return None
        data = bytearray(view[start:start + info.compress_size])  # writable arrays, as np.load gives
        if zlib.crc32(data) != info.CRC:
            raise zipfile.BadZipFile(f"Bad CRC-32 for file {info.filename!r}")
        out.append((info.filename, data))
    return out


def _np_load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def gather(pool: np.ndarray, index: np.ndarray, axis: int) -> np.ndarray:
    out = np.take(pool, np.maximum(index, 0), axis=axis)
    empty = index < 0
    if empty.any():
        sl = [slice(None)] * out.ndim
        sl[axis] = empty
        out[tuple(sl)] = 0.0
    return out


@dataclass(frozen=True)
class CalibrationSet:
    dir: Path
    hash: str
    samples: int
    prompt_set: str
    prompt_set_hash: str
    excluded: dict | None = None  # positions the component left out (decode step: attention sinks, ``lm_sinks``)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        pools: dict[str, np.ndarray] = {}
        for i in range(self.samples):
            yield _assemble(read_sample(self.dir / f"sample_{i:06d}.npz"), pools, self.dir)

    def provenance(self) -> dict:
        return {"hash": self.hash, "samples": self.samples, "prompt_set": self.prompt_set,
                "prompt_set_hash": self.prompt_set_hash, **({"excluded": self.excluded} if self.excluded else {})}

    @classmethod
    def open(cls, d: Path) -> "CalibrationSet":
        idx = json.loads((Path(d) / INDEX).read_text())
        return cls(Path(d), idx["hash"], idx["samples"], idx["prompt_set"], idx["prompt_set_hash"], idx.get("excluded"))


def select(n_total: int, max_samples: int) -> set[int]:
    """Evenly spread sample indices (early and late positions alike, so cache ranges are covered)."""
    if n_total <= max_samples:
        return set(range(n_total))
    return {int(round(i * (n_total - 1) / (max_samples - 1))) for i in range(max_samples)}


def write_set(out: Path, feeds: Iterable[dict[str, np.ndarray]], n_total: int, max_samples: int,
              prompt_set: str, prompt_set_hash: str) -> CalibrationSet:
    """Check and write the selected feeds (sample ``i`` is the ``i``-th feed); refuses NaN/inf with the sample and
    input named."""
    return write_indexed_set(out, enumerate(feeds), select(n_total, max_samples), prompt_set, prompt_set_hash)


def _assemble(stored: dict[str, np.ndarray], pools: dict[str, np.ndarray], d: Path) -> dict[str, np.ndarray]:
    """A stored sample as the graph's feed: every ``Rows`` input gathered from its pool (pools loaded once)."""
    feed = {k: v for k, v in stored.items() if not k.endswith((".rows", ".pool", ".axis"))}
    for k in stored:
        if k.endswith(".rows"):
            name = k[: -len(".rows")]
            pool = str(stored[f"{name}.pool"])
            if pool not in pools:
                pools[pool] = np.load(d / POOL_DIR / f"{pool}.npy")
            feed[name] = gather(pools[pool], stored[k], int(stored[f"{name}.axis"]))
    return feed


def write_indexed_set(out: Path, pairs: Iterable[tuple[int, dict[str, np.ndarray]]], keep: set[int],
                      prompt_set: str, prompt_set_hash: str, pools: dict[str, np.ndarray] | None = None
                      ) -> CalibrationSet:
    """``write_set`` for ``(index, feed)`` pairs in any order (a batched capture produces several prompts' samples
    at once): sample files are numbered by index order, so the set is the one a sequential capture writes.

    A feed's input may be ``Rows`` into ``pools`` (a mapping the capture fills while it runs; read once every pair
    is consumed). The hash covers what is stored: small inputs, row indices and every pool's bytes."""
    rank = {i: j for j, i in enumerate(sorted(keep))}
    digests: dict[int, str] = {}
    used: set[str] = set()
    for i, f in pairs:
        if i not in rank or rank[i] in digests:
            continue
        stored = {}
        for name, a in f.items():
            if isinstance(a, Rows):
                used.add(a.pool)
                stored.update(a.stored(name))
                continue
            if not np.all(np.isfinite(a)):
                raise CalibrationError(f"calibration sample {i} input {name!r} contains NaN or inf")
            stored[name] = a
        np.savez(out / f"sample_{rank[i]:06d}.npz", **stored)
        digests[rank[i]] = hash_tensors(stored)
    if not digests:
        raise CalibrationError(f"calibration prompt set {prompt_set!r} produced no samples")
    if sorted(digests) != list(range(len(digests))):
        raise CalibrationError(f"calibration capture skipped sample(s): got {len(digests)} of {len(keep)}")
    pool_digests = {}
    if used:
        missing = used - set(pools or {})
        if missing:
            raise CalibrationError(f"calibration capture refers to row pool(s) it never wrote: {sorted(missing)[:3]}")
        (out / POOL_DIR).mkdir()
        for name in sorted(used):
            a = np.ascontiguousarray(pools[name])
            if not np.all(np.isfinite(a)):
                raise CalibrationError(f"calibration row pool {name!r} contains NaN or inf")
            np.save(out / POOL_DIR / f"{name}.npy", a)
            pool_digests[name] = hash_tensors({name: a})
    h = hash_value([digests[j] for j in range(len(digests))] + ([pool_digests] if pool_digests else []))
    (out / INDEX).write_text(json.dumps({"hash": h, "samples": len(digests), "prompt_set": prompt_set,
                                         "prompt_set_hash": prompt_set_hash}, indent=2))
    return CalibrationSet(out, h, len(digests), prompt_set, prompt_set_hash)


def validate(cs: CalibrationSet, specs) -> None:
    """Every sample must carry every graph input with the declared shape and finite values. Checked on what is
    stored, without assembling: an input stored as ``Rows`` is checked as its pool (finite, read once) and its row
    indices (each an existing row of the pool, or -1 for an empty slot), which is what its gathered array is made of."""
    want = {s.name: tuple(s.shape) for s in specs}
    pools: dict[str, np.ndarray] = {}
    for i in range(cs.samples):
        stored = read_sample(cs.dir / f"sample_{i:06d}.npz")
        names = {k[: -len(".rows")] if k.endswith(".rows") else k for k in stored
                 if not k.endswith((".pool", ".axis"))}
        missing = set(want) - names
        if missing:
            raise CalibrationError(f"calibration sample {i} lacks input(s) {sorted(missing)}")
        for n, shape in want.items():
            if n in stored:
                got, finite = tuple(stored[n].shape), bool(np.all(np.isfinite(stored[n])))
            else:
                pool_name, rows, axis = str(stored[f"{n}.pool"]), stored[f"{n}.rows"], int(stored[f"{n}.axis"])
                if pool_name not in pools:
                    pools[pool_name] = np.load(cs.dir / POOL_DIR / f"{pool_name}.npy", mmap_mode="r")
                pool = pools[pool_name]
                if rows.ndim != 1 or not 0 <= axis < pool.ndim or (rows.size and not (
                        rows.min() >= -1 and rows.max() < pool.shape[axis])):
                    raise CalibrationError(f"calibration sample {i} input {n!r} indexes rows its pool "
                                           f"{pool_name!r} does not have")
                got = tuple(pool.shape[:axis]) + (len(rows),) + tuple(pool.shape[axis + 1:])
                finite = True  # the pool's values are checked once, below
            if got != shape:
                raise CalibrationError(f"calibration sample {i} input {n!r} has shape {got}, expected {shape}")
            if not finite:
                raise CalibrationError(f"calibration sample {i} input {n!r} contains NaN or inf")
    for pool_name, pool in pools.items():
        if not np.all(np.isfinite(pool)):
            raise CalibrationError(f"calibration row pool {pool_name!r} contains NaN or inf")
