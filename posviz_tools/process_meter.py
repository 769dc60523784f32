"""What a process costs, read from Linux's /proc: its CPU seconds, its peak memory, and the CPU of the Chromium this
process started (the load test's browser; ``posviz_tools.loadtest``, ``posviz_tools.bench_protocol``)."""
from __future__ import annotations

import os
import re
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name (which may hold spaces), or None when the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _descendants(root: int) -> set[int]:
    """Every live process below ``root`` in the process tree (by each process's parent id)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def browser_cpu_seconds() -> float:
    """CPU seconds used so far by the Chromium this process started (Playwright's driver's children), with
    the renderers it has already reaped (cutime + cstime of the browser process).

    Only this process's own descendants: on a test run with several workers another worker's Chromium
    closing between two readings would make the difference negative (a CI run measured -32 s). A renderer
    that exits and is reaped between two readings moves its time into its parent's cutime, so the sum does
    not fall when a tab closes."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in _descendants(os.getpid()):
        try:
            if not Path(f"/proc/{pid}/comm").read_text().startswith("chrom"):
                continue
        except OSError:
            continue
        fields = _stat_fields(pid)
        if fields is not None:
            total += sum(int(f) for f in fields[11:15]) / tick
    return total


def peak_rss_mb(pid: int) -> float | None:
    """The process's peak resident memory (VmHWM), in MB; None when /proc cannot tell."""
    try:
        match = re.search(r"^VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    except OSError:
        return None
    return int(match.group(1)) / 1024 if match else None
