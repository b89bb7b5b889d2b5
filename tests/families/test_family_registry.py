"""The family registry (``families.FAMILIES``) and the family folders stay in sync, and each family is complete: its
components build from the registry entry, its shipped prompt sets load by name, its tokenizer comes with the bundle."""
from pathlib import Path

import pytest

import omni_export.families as families
from omni_export.errors import BadInput, RecipeError

ROOT = Path(families.__file__).parent


def test_registry_lists_every_family_folder_and_nothing_else():
    folders = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert set(families.FAMILIES) == folders
    for name in families.FAMILIES:
        fam = families.get_family(name)
        assert fam.name == name and fam.components, name
        assert fam.prompts == ROOT / name / "prompts"  # a shipped family's prompt sets live in its folder


def test_unknown_family_is_a_one_line_recipe_error():
    with pytest.raises(RecipeError, match=r"unknown model family 'nope'; known: spark, qwen3_tts, llama"):
        families.get_family("nope")


def test_prompt_sets_are_found_in_their_family_folder():
    counts = {"spark_parity": 4, "spark_calibration": 8, "qwen3_tts_parity": 3, "qwen3_tts_calibration": 5}
    for name, n in counts.items():
        ps = families.load_prompt_set(name)
        assert ps.name == name and len(ps.prompts) == n
    with pytest.raises(BadInput, match="prompt set 'nope' not found"):
        families.load_prompt_set("nope")


def test_seeded_bundles_carry_the_byte_tokenizer_of_their_vocabulary(tiny_spark):
    assert tiny_spark.tokenizer.name == "bytes+3" and tiny_spark.tokenizer.vocab_size == 4096
    assert tiny_spark.tokenizer.encode("Hi", 8) == [1, 72 + 3, 105 + 3]
