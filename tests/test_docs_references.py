"""Every repository file the docs name exists: a backticked path in ``docs/*.md`` or ``README.md`` with a directory
part and a known extension (``components/decoder_lm.py``, ``tests/parity/test_gate.py::test_x``,
``benchmarks/results/x.json``) is a file of this checkout, found from the repository's root, from the package
(the docs name modules as ``exporters/onnx.py``) or from the document's own folder."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
PATH = re.compile(r"[A-Za-z0-9_.\-]+(?:/[A-Za-z0-9_.\-]+)+\.(?:py|md|yaml|yml|json|toml|txt|sh|html|csv)")
SPAN = re.compile(r"`([^`\n]+)`")

# paths the docs name that are not files of this repository, each with why
NOT_HERE = {
    "hub/ledger.json": "a file of the artifact store (the AI Hub job ledger), not of the repository",
    "omni_export/recipes/NAME.yaml": "a pattern: NAME stands for a recipe's name",
    "flashcosyvoice/modules/hifigan.py": "MiniCPM-o's upstream vocoder code, in its own repository",
}


def named_paths(text: str) -> list[str]:
    """The backticked spans of ``text`` that are a path and nothing else (``path``, ``path:name``, ``path::test``)."""
    out = []
    for span in SPAN.findall(text):
        path = re.split(r"::|:(?=[A-Za-z_])", span.strip())[0]
        if PATH.fullmatch(path) and not path.startswith(("/", "~", "http")):
            out.append(path)
    return out


def exists(path: str, doc: Path) -> bool:
    return any((base / path).exists() for base in (ROOT, ROOT / "omni_export", doc.parent))


def test_the_scan_finds_paths_and_only_paths():
    text = ("`components/decoder_lm.py`, `tests/x/test_y.py::test_z`, `exporters/qdq_onnx.py:QdqPart`, "
            "`decoder_lm.py`, `--out a/b.json x`, `docs/ci/github-actions.yml`, `a/b.onnx`")
    assert named_paths(text) == ["components/decoder_lm.py", "tests/x/test_y.py", "exporters/qdq_onnx.py",
                                 "docs/ci/github-actions.yml"]


def test_every_path_in_the_docs_exists():
    assert len(DOCS) > 5
    missing = [f"{doc.relative_to(ROOT)}:{n}: {p}" for doc in DOCS
               for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
               for p in named_paths(line) if p not in NOT_HERE and not exists(p, doc)]
    assert missing == []


@pytest.mark.parametrize("path", sorted(NOT_HERE))
def test_the_allowlist_names_only_paths_the_docs_use_and_that_are_not_here(path):
    assert any(path in named_paths(doc.read_text(encoding="utf-8")) for doc in DOCS), f"{path}: no doc names it"
    assert not exists(path, ROOT / "docs"), f"{path} exists: drop it from NOT_HERE"
