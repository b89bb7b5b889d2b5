"""One tiny store (``store_helpers.tiny_recipe_data``: about 15 s cold, 4 s cached), built once and shared by the
tests that only read it; tests that change a store work on a copy (``store_copy``)."""
import shutil

import pytest
import yaml

from omni_export.commands.cli import main
from store_helpers import tiny_recipe_data


@pytest.fixture(scope="session")
def tiny_yaml(tmp_path_factory):
    p = tmp_path_factory.mktemp("recipe") / "tiny_store.yaml"
    p.write_text(yaml.safe_dump(tiny_recipe_data()))
    return p


@pytest.fixture(scope="session")
def built_store(tmp_path_factory, tiny_yaml):
    """Read-only: copy it (``store_copy``) to change anything."""
    store = tmp_path_factory.mktemp("built") / "store"
    assert main(["recipe", str(tiny_yaml), "--store", str(store)]) == 0
    return store


@pytest.fixture
def store_copy(built_store, tmp_path):
    dst = tmp_path / "store"
    shutil.copytree(built_store, dst, symlinks=True)
    return dst

