"""Peak memory of the current process, for the benchmarks."""

from __future__ import annotations

import resource
from pathlib import Path


def peak_rss_mib() -> float:
    """Peak RSS of this process since it started (VmHWM), in MiB.

    Not ``getrusage().ru_maxrss``: on Linux that keeps the parent's peak across fork and exec,
    so a child started by a big parent would report the parent's memory as its own.
    """
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
