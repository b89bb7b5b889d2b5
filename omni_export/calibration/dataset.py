"""Calibration sets: graph inputs captured by running the fp32 pipeline, stored one sample per file with a
content hash that every artifact's manifest references. Samples stream from disk, so memory stays bounded."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from ..artifacts.hashing import hash_tensors, hash_value
from ..errors import CalibrationError

INDEX = "index.json"


@dataclass(frozen=True)
class CalibrationSet:
    dir: Path
    hash: str
    samples: int
    prompt_set: str
    prompt_set_hash: str
    excluded: dict | None = None  # positions the component left out (decode step: attention sinks, ``lm_sinks``)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for i in range(self.samples):
            with np.load(self.dir / f"sample_{i:06d}.npz") as z:
                yield {k: z[k] for k in z.files}

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


def write_indexed_set(out: Path, pairs: Iterable[tuple[int, dict[str, np.ndarray]]], keep: set[int],
                      prompt_set: str, prompt_set_hash: str) -> CalibrationSet:
    """``write_set`` for ``(index, feed)`` pairs in any order (a batched capture produces several prompts' samples
    at once): sample files are numbered by index order, so the set is the one a sequential capture writes."""
    rank = {i: j for j, i in enumerate(sorted(keep))}
    digests: dict[int, str] = {}
    for i, f in pairs:
        if i not in rank or rank[i] in digests:
            continue
        for name, a in f.items():
            if not np.all(np.isfinite(a)):
                raise CalibrationError(f"calibration sample {i} input {name!r} contains NaN or inf")
        np.savez(out / f"sample_{rank[i]:06d}.npz", **f)
        digests[rank[i]] = hash_tensors(f)
    if not digests:
        raise CalibrationError(f"calibration prompt set {prompt_set!r} produced no samples")
    if sorted(digests) != list(range(len(digests))):
        raise CalibrationError(f"calibration capture skipped sample(s): got {len(digests)} of {len(keep)}")
    h = hash_value([digests[j] for j in range(len(digests))])
    (out / INDEX).write_text(json.dumps({"hash": h, "samples": len(digests), "prompt_set": prompt_set,
                                         "prompt_set_hash": prompt_set_hash}, indent=2))
    return CalibrationSet(out, h, len(digests), prompt_set, prompt_set_hash)


def validate(cs: CalibrationSet, specs) -> None:
    """Every sample must carry every graph input with the declared shape and finite values."""
    want = {s.name: tuple(s.shape) for s in specs}
    for i, f in enumerate(cs):
        missing = set(want) - set(f)
        if missing:
            raise CalibrationError(f"calibration sample {i} lacks input(s) {sorted(missing)}")
        for n, shape in want.items():
            if tuple(f[n].shape) != shape:
                raise CalibrationError(f"calibration sample {i} input {n!r} has shape {tuple(f[n].shape)}, expected {shape}")
            if not np.all(np.isfinite(f[n])):
                raise CalibrationError(f"calibration sample {i} input {n!r} contains NaN or inf")
