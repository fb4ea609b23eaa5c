"""What the benchmarks read from /proc: a process with its live descendants, their CPU time and memory."""

from __future__ import annotations

import os
from pathlib import Path


def descendants(pid: int) -> list[int]:
    """`pid` and every live process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of a process and its live descendants."""
    total = 0
    for current in descendants(pid):
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return total / os.sysconf("SC_CLK_TCK")


def status_kib(pid: int, key: str) -> int:
    """A `/proc/<pid>/status` figure in KiB (VmRSS, VmHWM, ...); 0 if the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_rss_kib(pid: int, include_self: bool = True) -> int:
    """Resident memory of a process tree."""
    return sum(status_kib(p, "VmRSS") for p in descendants(pid) if include_self or p != pid)
