"""The peak resident memory and the local I/O of a benchmark's process tree (Linux ``/proc``).

A Spark engine's state lives in its JVM (RocksDB) or in its Python workers (this runtime):
:class:`TreeSampler` samples every descendant of this process a few times a second and keeps,
for each, its high-water mark of resident memory (``VmHWM``, a peak the kernel keeps, so a
sample misses nothing while the process lives; shared libraries and pages shared with the
process it was forked from count in it), the largest anonymous resident memory sampled
(``RssAnon``: heap and Arrow buffers, the part that state can grow; a peak between two
samples is missed) and its last I/O counters (``read_bytes`` and
``write_bytes``: bytes that went to or came from the block device; ``rchar``/``wchar``: every
read and write call, page cache and sockets included).
"""

from __future__ import annotations

import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Sampled:
    """What one process showed at its last sample."""

    kind: str
    peak_rss: int = 0
    peak_anon: int = 0
    read_bytes: int = 0
    write_bytes: int = 0
    rchar: int = 0
    wchar: int = 0


def _children() -> dict[int, list[int]]:
    """Parent pid -> child pids, for every process now."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        tree.setdefault(parent, []).append(int(entry))
    return tree


def _kind(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
    if "pyspark.daemon" in cmdline or "pyspark.worker" in cmdline:
        return "python_worker"
    return "jvm" if "java" in cmdline.split(" ", 1)[0] else "other"


def _fields(path: str, names: tuple[str, ...]) -> dict[str, int]:
    found: dict[str, int] = {}
    with open(path) as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in names:
                found[name] = int(rest.split()[0])
    return found


class TreeSampler:
    """Samples this process's descendants every ``interval`` seconds until :meth:`stop`."""

    def __init__(self, interval: float = 0.2) -> None:
        self._interval = interval
        self._stop = threading.Event()
        self.processes: dict[int, Sampled] = {}
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> TreeSampler:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.sample()

    def sample(self) -> None:
        tree = _children()
        todo = list(tree.get(os.getpid(), []))
        while todo:
            pid = todo.pop()
            todo.extend(tree.get(pid, []))
            try:
                seen = self.processes.get(pid) or Sampled("")
                seen.kind = _kind(pid)  # again: a launcher script execs the JVM
                status = _fields(f"/proc/{pid}/status", ("VmHWM", "RssAnon"))
                io = _fields(f"/proc/{pid}/io", ("read_bytes", "write_bytes", "rchar", "wchar"))
            except (OSError, ValueError):
                continue  # gone meanwhile
            seen.peak_rss = max(seen.peak_rss, status.get("VmHWM", 0) * 1024)
            seen.peak_anon = max(seen.peak_anon, status.get("RssAnon", 0) * 1024)
            seen.read_bytes, seen.write_bytes = io["read_bytes"], io["write_bytes"]
            seen.rchar, seen.wchar = io["rchar"], io["wchar"]
            self.processes[pid] = seen

    def stop(self) -> dict[str, Any]:
        """Stop; per kind of process: each one's peak resident bytes and the summed I/O."""
        self._stop.set()
        self._thread.join()
        self.sample()
        summary: dict[str, Any] = {}
        for sampled in self.processes.values():
            kind = summary.setdefault(
                sampled.kind,
                {
                    "peak_rss": [],
                    "peak_anon": [],
                    "read_bytes": 0,
                    "write_bytes": 0,
                    "rchar": 0,
                    "wchar": 0,
                },
            )
            kind["peak_rss"].append(sampled.peak_rss)
            kind["peak_anon"].append(sampled.peak_anon)
            for name, value in asdict(sampled).items():
                if name not in ("kind", "peak_rss", "peak_anon"):
                    kind[name] += value
        return summary


def tree_cpu() -> float:
    """CPU seconds of this process and its descendants (their waited-for children too: a
    pool's worker processes, once joined, count in the process that reaped them)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        times[pid] = sum(int(f) for f in fields[11:15]) / TICK
    below, found = {os.getpid()}, True
    while found:
        found = False
        for pid, parent in parents.items():
            if parent in below and pid not in below:
                below.add(pid)
                found = True
    return sum(times.get(pid, 0.0) for pid in below)
