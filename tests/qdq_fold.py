"""The check that CPU-QDQ parity's folded session (``runtimes.ort.cpu_session(fold_weights=True)``) is exact, shared by
``tests/exporters/test_qdq_cpu_fold.py`` (a small Spark) and ``tests/families/llama/test_llama_recipe.py`` (SmolLM2)."""
import numpy as np

from omni_export.runtimes import ort as ort_rt


def assert_fold_is_exact(model, feeds, n=6):
    """The folded session's outputs equal the default session's, bit for bit, on ``n`` feeds."""
    default, folded = ort_rt.cpu_session(model), ort_rt.cpu_session(model, fold_weights=True)
    names = [o.name for o in default.get_outputs()]
    for feed in feeds[:n]:
        a, b = default.run(names, feed), folded.run(names, feed)
        for name, x, y in zip(names, a, b):
            assert np.array_equal(x, y), (model.name, name, float(np.max(np.abs(x - y))))
    return len(names)
