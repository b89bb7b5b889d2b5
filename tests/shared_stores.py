"""Whole-recipe stores built once per test session and shared by every test, in every pytest-xdist worker, that only
reads them (the ``shared_store`` fixture of ``tests/conftest.py``).

A store is keyed by the recipe's content and the command-line options it is built with: the first worker to ask
builds it (``omni-export recipe`` through ``omni_export.commands.cli.main``, as a test would) under a file lock, the
others wait for it and reuse it. The stores live under the session's base temporary directory, so they never outlive the session
(nothing built by an older checkout of the code is ever reused). ``seed=`` starts a build from a copy of another
shared store's ``cache/``: the pipeline's step cache is keyed by content, so the fp32 references, calibration sets and
exports the two recipes have in common are reused, and only what differs is built.

A test that changes a store works on ``copy_store(shared.path, tmp_path / "store")``; ``assert_unchanged`` (called
when the session ends) fails loudly if a reader wrote into a shared store after all.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml
from filelock import FileLock

# The builds the suite leaves out of ``omni-export recipe smollm2_w8a16`` (``smollm2_w8a16_ci``), which the SmolLM2
# recipe and deploy tests share, for CI time:
SMOLLM2_CI_SKIPS = {
    # the SM8750 context binaries on the x86 HTP simulator: 8 s a decode step and 22 s a prefill call on one core, 160
    # s of CI with their compiles. Their figures are the recorded run (``omni-export recipe smollm2_w8a16``,
    # docs/parity.md); CI executes a trained model's context binary on the HTP with Gemma 3's decode step
    # (tests/families/gemma3/test_gemma3_recipe.py) and the decode step's and prefill's binaries on tiny models
    "qnn_context": "w8a16",
    # Genie on the x86 HTP simulator takes 7-18 s a step: the trained model's bundle is a recorded run
    # (benchmarks/genie_smollm2.py, docs/deploy.md); the genie target is gated in Genie on tiny models
    # (tests/exporters/test_genie.py)
    "genie": "w8a16",
    # the XNNPACK lowering of the trained decode step (about 70 s quiet) computes the same fp32 function as the fp32
    # ONNX graph this run checks at >= 100 dB; the executorch target's fp32 parity is gated on tiny models
    # (tests/exporters/test_executorch.py)
    "executorch": "fp32",
}


# ... and the component it leaves out: the AR-N prefill (its fp32 ONNX export 13 s, its w8a16 QDQ export 35 s, their
# parity 7 s on one core). Its trained figures are the recorded run (``omni-export recipe smollm2_w8a16``,
# docs/parity.md); CI builds and gates the prefill's fp32, w8a16 QDQ and SM8750 builds on Spark
# (``spark_w8a16``, tests/test_end_to_end.py) and the decode step on both trained models
SMOLLM2_CI_COMPONENTS = ["decode_step"]


def smollm2_w8a16_ci() -> dict:
    """The shipped ``smollm2_w8a16`` recipe's data less the builds of ``SMOLLM2_CI_SKIPS``, for the components of
    ``SMOLLM2_CI_COMPONENTS``; everything else as shipped (a build or component named there that the recipe does not
    have is an error)."""
    data = yaml.safe_load(resources.files("omni_export.recipes").joinpath("smollm2_w8a16.yaml").read_text())
    kept = [b for b in data["builds"] if SMOLLM2_CI_SKIPS.get(b["target"]) != b["scheme"]]
    assert len(data["builds"]) - len(kept) == len(SMOLLM2_CI_SKIPS), data["builds"]
    assert set(SMOLLM2_CI_COMPONENTS) < set(data["components"]), data["components"]
    left = [c for c in data["components"] if c not in SMOLLM2_CI_COMPONENTS]
    return {**data, "builds": kept, "components": SMOLLM2_CI_COMPONENTS,
            "options": {c: o for c, o in data.get("options", {}).items() if c not in left},
            "thresholds": {k: v for k, v in data["thresholds"].items() if k.split("/")[0] not in left}}

RESULT = "result.json"  # written last: a directory without it is a build that did not finish


@dataclass(frozen=True)
class SharedStore:
    path: Path        # the store: read it, never write it (copy_store first)
    recipe: str       # what ``omni-export recipe`` was given: a shipped name or the recipe file
    exit_code: int
    out: str          # what the run printed on stdout (the summary table)

    def assert_unchanged(self) -> None:
        recorded = json.loads((self.path.parent / RESULT).read_text())["tree"]
        now = _tree(self.path)
        changed = sorted(k for k in recorded.keys() | now.keys() if recorded.get(k) != now.get(k))
        assert not changed, (f"a test wrote into the shared store {self.path} (copy it with copy_store first): "
                             f"{', '.join(changed[:5])}")


def session_dir(tmp_path_factory) -> Path:
    """The directory every xdist worker of this session shares (each worker's base temp is ``<session>/popen-gwN``);
    the base temp itself in a single-process run."""
    base = tmp_path_factory.getbasetemp()
    d = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared-stores"
    d.mkdir(exist_ok=True)
    return d


def _tree(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): [p.stat().st_size, p.stat().st_mtime_ns]
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".lock"}


def copy_store(src: Path, dst: Path, cache: bool = True) -> Path:
    """A private copy of a (shared) store to change; ``cache=False`` leaves out the step cache."""
    shutil.copytree(src, dst, symlinks=True, ignore=None if cache else shutil.ignore_patterns("cache"))
    return dst


def build_shared(tmp_path_factory, recipe: str | dict, *args, seed: SharedStore | None = None) -> SharedStore:
    """``omni-export recipe RECIPE --store S ARGS...`` once per session for this recipe content and these options.

    ``recipe`` is a shipped recipe's name (run by name) or the recipe's data (written to ``<name>.yaml`` and run from
    that file). The caller asserts the exit code (``SharedStore.exit_code``)."""
    from omni_export.commands.cli import main

    if isinstance(recipe, str):
        name, text = recipe, resources.files("omni_export.recipes").joinpath(f"{recipe}.yaml").read_text()
    else:
        name, text = recipe["name"], yaml.safe_dump(recipe, sort_keys=True, allow_unicode=True)
    args = [str(a) for a in args]
    key = hashlib.sha256(json.dumps({"recipe": text, "by_name": isinstance(recipe, str), "args": args,
                                     "seed": str(seed.path) if seed else None}).encode()).hexdigest()[:16]
    d = session_dir(tmp_path_factory) / f"{name}-{key}"
    with FileLock(str(d) + ".lock"):
        if not (d / RESULT).is_file():
            shutil.rmtree(d, ignore_errors=True)  # a build that died half-way
            d.mkdir()
            given = name
            if not isinstance(recipe, str):
                given = str(d / f"{name}.yaml")
                Path(given).write_text(text)
            store = d / "store"
            if seed is not None:
                shutil.copytree(seed.path / "cache", store / "cache", symlinks=True)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                code = main(["recipe", given, "--store", str(store), *args])
            (d / RESULT).write_text(json.dumps({"recipe": given, "exit_code": code, "out": out.getvalue(),
                                                "tree": _tree(store)}))
    res = json.loads((d / RESULT).read_text())
    return SharedStore(d / "store", res["recipe"], res["exit_code"], res["out"])
