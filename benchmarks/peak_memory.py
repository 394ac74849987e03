"""A process's peak resident memory, as the memory benchmarks measure it."""

from __future__ import annotations

import resource


def peak_rss() -> int:
    """This process's peak resident memory in bytes: Linux's VmHWM, the high-water mark of
    its own address space (``ru_maxrss`` also keeps the parent's peak at the time of exec, so
    a child of a larger process, such as a pytest run, would measure no growth), else
    ``ru_maxrss``."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak() -> int:
    """Lower this process's peak to its resident memory now (Linux: ``clear_refs``), so that
    :func:`peak_rss` then measures the peak of what follows alone; returns that resident
    memory in bytes (0 where it cannot be reset: the peak is then the process's whole)."""
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
