"""Peak resident memory of this process, per pipeline stage.

On Linux the kernel's high-water mark (``VmHWM``) can be reset (``/proc/self/clear_refs``, value 5), so each stage's
own peak is measured exactly. Elsewhere the process-wide peak (``getrusage``) is reported, an upper bound."""
from __future__ import annotations

import resource
import sys


def reset_peak() -> bool:
    """Start a new high-water mark; False where the platform cannot (the peak then covers the whole process)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return ru if sys.platform == "darwin" else ru * 1024  # bytes on macOS, KiB elsewhere
