"""The JSON Schemas of the two typed documents, as published under ``docs/schemas/``.

``python -m omni_export.commands.schemas docs/schemas`` rewrites them; ``tests/recipes/test_recipes.py`` fails when
the published files differ from what the code declares.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def schemas() -> dict[str, dict]:
    from ..recipes import json_schema as recipe_schema
    from ..artifacts.manifest_schema import json_schema as manifest_schema
    return {"recipe.schema.json": recipe_schema(), "manifest.schema.json": manifest_schema()}


def render(schema: dict) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def write(out: Path) -> list[Path]:
    from ..artifacts.atomic import write_text_atomic

    written = []
    for name, schema in schemas().items():
        write_text_atomic(Path(out) / name, render(schema))
        written.append(Path(out) / name)
    return written


if __name__ == "__main__":
    for p in write(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/schemas")):
        print(p)
