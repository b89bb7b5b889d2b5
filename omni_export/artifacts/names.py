"""Names that become directories of the store: a recipe's name (``published/<recipe>/``, ``runs/<recipe>/``) and an
artifact's id (``published/<recipe>/<artifact>/``). One path component of safe characters: never empty, ``.`` or
``..``, a separator or a NUL, and short enough for every temporary name built from it."""
from __future__ import annotations

import re

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
NAME_MAX = 128  # a recipe file's name is at most 100 (``recipes.RECIPE_NAME_MAX``): room for a sweep's "-sweep"


def name_problem(name, max_len: int = NAME_MAX) -> str | None:
    """Why ``name`` cannot name a recipe or an artifact (None when it can)."""
    if not isinstance(name, str):
        return f"is {type(name).__name__}, not a string"
    if len(name) > max_len:
        return f"is {len(name)} characters long (at most {max_len})"
    if not NAME_RE.fullmatch(name):
        return ("must start with a letter or digit and hold only letters, digits, '_', '.' and '-' (it becomes a "
                "directory of the store)")
    return None
