"""Per-stage peak memory: the figure the run report gives for every pipeline stage."""
import subprocess
import sys
import textwrap

CHECK = textwrap.dedent("""
    import numpy as np
    from omni_export import memory
    memory.reset_peak()
    a = np.ones(256 * 2**20 // 8)  # 256 MiB, touched
    inside = memory.peak_rss_bytes()
    assert inside >= 256 * 2**20, inside
    del a
    if memory.reset_peak():  # Linux: the next stage starts a new high-water mark
        assert memory.peak_rss_bytes() < inside - 200 * 2**20, (memory.peak_rss_bytes(), inside)
    print("ok")
""")


def test_peak_rss_sees_an_allocation_and_resets_between_stages():
    """In a fresh interpreter: a long-lived test worker's heap (memory its allocator kept after earlier tests) must
    not decide whether the high-water mark resets."""
    r = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
