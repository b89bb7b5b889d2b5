"""Per-stage peak memory: the figure the run report gives for every pipeline stage."""
import numpy as np

from omni_export import memory


def test_peak_rss_sees_an_allocation_and_resets_between_stages():
    memory.reset_peak()
    a = np.ones(256 * 2**20 // 8)  # 256 MiB, touched
    inside = memory.peak_rss_bytes()
    assert inside >= 256 * 2**20
    del a
    if memory.reset_peak():  # Linux: the next stage starts a new high-water mark
        assert memory.peak_rss_bytes() < inside - 200 * 2**20
