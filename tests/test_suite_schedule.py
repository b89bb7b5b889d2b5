"""The suite's own schedule (``tests/xdist_units.py``, used by ``tests/conftest.py``): the files it names exist, and
files that read one shared store are one unit of work, so a single xdist worker runs them in order."""
from pathlib import Path

from xdist_units import ORDER, UNITS, work_unit

TESTS = Path(__file__).parent


def test_every_file_the_schedule_names_exists_once():
    assert all((TESTS / f).is_file() for f in ORDER), [f for f in ORDER if not (TESTS / f).is_file()]
    assert len(ORDER) == sum(map(len, UNITS))  # no file twice


def test_the_files_that_read_one_store_are_one_unit_and_the_others_their_own():
    e2e = "tests/test_end_to_end.py::test_spark_w8a16_publishes_a_verified_context_binary"
    assert work_unit(e2e) == "tests/components/test_decoder_prefill.py"
    assert work_unit("tests/recipes/test_qwen3_tts_recipes.py::t[x::y]") == "tests/commands/test_sweep_qwen3_tts.py"
    assert work_unit("tests/test_schemes.py::test_a") == "tests/test_schemes.py"
    # a unit's files run in their listed order, the builder first
    assert ORDER["components/test_decoder_prefill.py"] < ORDER["test_end_to_end.py"]
