"""The suite's schedule over pytest-xdist workers, read by ``tests/conftest.py`` (its collection order and its
scheduler) and checked by ``tests/test_suite_schedule.py``: a module of its own, because a test module's
``import conftest`` finds whichever ``conftest`` was imported first (``tests/parity/conftest.py`` in a full run)."""

# The longest files, longest first (measured: docs/ci.md "Test times"). xdist hands each worker whole files in
# collection order (``--dist loadfile --no-loadscope-reorder``; xdist's default reorder by test count would start
# a 16-parameter file of seconds before a one-test file of a quarter hour), so the long files start at once on
# both workers and the short ones fill in at the end. A tuple is files that read one shared store, the file that
# builds it first: one worker runs them one after another (``pytest_xdist_make_scheduler`` in tests/conftest.py),
# so no worker waits with its core idle for a store the other is still building.
LONGEST_FIRST = (
    "families/llama/test_llama_recipe.py",  # the trained SmolLM2's recipe, then its runner and GenAI bundles
    "families/llama/test_llama_sweep.py",   # the SmolLM2 sweep rows that need nothing of the recipe's store
    ("families/gemma3/test_gemma3_recipe.py",  # the trained Gemma 3's w8a16 decode step, CPU-QDQ and HTP; then
     "families/gemma3/test_gemma3_270m.py",    # the files that load the same GGUF, in the same process: its
     "families/gemma3/test_gemma3_w8a16.py"),  # dequantized weights and tokenizer are reused (checkpoint._SEEN)
    ("commands/test_sweep_qwen3_tts.py",  # qwen3_tts_w8a16 (small): built here, read by the next three
     "recipes/test_qwen3_tts_recipes.py", "families/qwen3_tts/test_qwen3_tts_frame.py",
     "families/qwen3_tts/test_qwen3_tts_code2wav_quant.py"),
    "recipes/test_qwen3_tts_targets.py",
    "families/minicpmo/test_minicpmo_recipes.py",
    ("components/test_decoder_prefill.py", "test_end_to_end.py"),  # spark_w8a16: built by the first, read by both
    "artifacts/test_runs.py",
    "hub/test_jobs.py",
    "hub/test_every_recipe.py",
)
UNITS = tuple((u,) if isinstance(u, str) else u for u in LONGEST_FIRST)  # every entry as a tuple of files
ORDER = {f: (i, j) for i, unit in enumerate(UNITS) for j, f in enumerate(unit)}  # file -> (unit, place in it)
ONE_WORKER = {f"tests/{f}": f"tests/{unit[0]}" for unit in UNITS for f in unit[1:]}  # a later file -> its unit


def work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its file, or the first file of its ``LONGEST_FIRST`` tuple."""
    f = nodeid.split("::", 1)[0]
    return ONE_WORKER.get(f, f)
