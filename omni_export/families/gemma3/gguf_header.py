"""A GGUF file's metadata and tensor table, read in one pass over the header bytes.

``gguf.GGUFReader`` builds a numpy view per metadata element: on Gemma 3's 262,144-piece vocabulary (three arrays of
that length) that alone takes about a minute on one core. This reader decodes the same header (GGUF versions 2 and
3, little-endian) with ``struct`` and returns what ``GGUFReader``'s ``fields[k].contents()`` and ``tensors`` give
(metadata as Python values and lists; each tensor's name, GGUF-order dims, type and bytes, a read-only memmap).
Anything it does not recognise (magic, version, value type, tensor type, a tensor past the end) is a one-line
``CheckpointError``.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import CheckpointError

# GGUF value types -> struct format (scalars); 8 string, 9 array
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
DEFAULT_ALIGNMENT = 32


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]      # GGUF order: fastest-varying dimension first (as ``GGUFReader``'s ``shape``)
    tensor_type: object         # gguf.GGMLQuantizationType
    data: np.ndarray            # uint8 [rows, bytes per row] (what ``gguf.quants.dequantize`` takes)


class _Cursor:
    def __init__(self, buf, name: str):
        self.buf, self.pos, self.name = buf, 0, name

    def take(self, fmt: str):
        try:
            v = struct.unpack_from("<" + fmt, self.buf, self.pos)
        except struct.error:
            raise CheckpointError(f"{self.name} is not a readable GGUF file: header truncated at byte {self.pos}") from None
        self.pos += struct.calcsize("<" + fmt)
        return v[0] if len(v) == 1 else v

    def string(self) -> str:
        n = self.take("Q")
        if self.pos + n > len(self.buf):
            raise CheckpointError(f"{self.name} is not a readable GGUF file: string past the end at byte {self.pos}")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def value(self, vtype: int, key: str):
        if vtype in _SCALAR:
            return self.take(_SCALAR[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, n = self.take("I"), self.take("Q")
            if etype == _STRING:
                return [self.string() for _ in range(n)]
            if etype in _SCALAR:
                fmt = _SCALAR[etype]
                size = struct.calcsize("<" + fmt)
                if self.pos + n * size > len(self.buf):
                    raise CheckpointError(f"{self.name}: GGUF array {key} runs past the end of the file")
                arr = np.frombuffer(self.buf, dtype=np.dtype("<" + fmt), count=n, offset=self.pos)
                self.pos += n * size
                return arr.tolist()
            raise CheckpointError(f"{self.name}: GGUF array {key} has element type {etype} (not a GGUF value type)")
        raise CheckpointError(f"{self.name}: GGUF metadata {key} has value type {vtype} (not a GGUF value type)")


def read_gguf(path: Path) -> tuple[dict, list[TensorInfo]]:
    """(metadata, tensors) of a GGUF file; tensor data stays on disk (memmapped) until read."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    path = Path(path)
    try:
        mm = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path.name} is not a readable GGUF file: {e}") from None
    cur = _Cursor(mm, path.name)
    if bytes(mm[:4]) != b"GGUF":
        raise CheckpointError(f"{path.name} is not a readable GGUF file: magic {bytes(mm[:4])!r}, not b'GGUF'")
    cur.pos = 4
    version = cur.take("I")
    if version not in (2, 3):
        swapped = struct.unpack(">I", struct.pack("<I", version))[0]
        why = "big-endian GGUF is not implemented" if swapped in (2, 3) else f"version {version} is not 2 or 3"
        raise CheckpointError(f"{path.name} is not a readable GGUF file: {why}")
    n_tensors, n_kv = cur.take("Q"), cur.take("Q")
    meta = {"GGUF.version": version, "GGUF.tensor_count": n_tensors, "GGUF.kv_count": n_kv}  # as GGUFReader
    for _ in range(n_kv):
        key = cur.string()
        if key in meta:
            raise CheckpointError(f"{path.name}: GGUF metadata {key} appears twice")
        meta[key] = cur.value(cur.take("I"), key)
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = tuple(cur.take("Q") for _ in range(cur.take("I")))
        raw_type, offset = cur.take("I"), cur.take("Q")
        try:
            qtype = GGMLQuantizationType(raw_type)
        except ValueError:
            raise CheckpointError(f"{path.name}: tensor {name} has GGML type {raw_type} (unknown)") from None
        infos.append((name, dims, qtype, offset))
    align = meta.get("general.alignment", DEFAULT_ALIGNMENT)
    if type(align) is not int or align <= 0 or align % 8:
        raise CheckpointError(f"{path.name}: GGUF general.alignment {align!r} is not a positive multiple of 8")
    start = -(-cur.pos // align) * align
    tensors = []
    for name, dims, qtype, offset in infos:
        block, type_size = GGML_QUANT_SIZES[qtype]
        if not dims or dims[0] % block:
            raise CheckpointError(f"{path.name}: tensor {name} dims {list(dims)} do not hold whole {qtype.name} blocks")
        row_bytes = dims[0] // block * type_size
        rows = int(np.prod(dims[1:], dtype=np.int64)) if len(dims) > 1 else 1
        lo = start + offset
        if lo + rows * row_bytes > len(mm):
            raise CheckpointError(f"{path.name}: tensor {name} runs past the end of the file")
        tensors.append(TensorInfo(name, dims, qtype, mm[lo:lo + rows * row_bytes].reshape(rows, row_bytes)))
    return meta, tensors
