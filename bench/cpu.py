"""CPU seconds charged by the kernel, read from ``/proc``: one process (with its descendants),
PostgreSQL's processes, the whole machine. Benchmarks divide them by the work done in the
same window to say what one cycle costs each part, and what the machine's cores allow.

All figures are seconds of CPU (user + system) since boot or since the process started;
a caller takes two snapshots and subtracts. Linux only (``/proc``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

__all__ = ["process_seconds", "postgres_seconds", "machine_busy_seconds", "snapshot", "delta",
           "PARTS"]

_TCK = os.sysconf("SC_CLK_TCK")

PARTS = ("machine", "generator", "servers", "postgres")
"""What ``snapshot`` reads: the machine's busy CPU (every core), the calling (generator)
process, the server processes named by pid, and every PostgreSQL process on the machine."""


def _stat_fields(pid: int | str) -> list[str]:
    """``/proc/PID/stat`` after the command name (fields 3 on: state, ppid, ...)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def process_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its live descendants (uvicorn workers); 0.0
    for a process that is gone."""
    total = 0.0
    try:
        fields = _stat_fields(pid)
        total = (int(fields[11]) + int(fields[12])) / _TCK
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                total += process_seconds(int(child))
    except (FileNotFoundError, ProcessLookupError):
        pass
    return total


def postgres_seconds() -> float:
    """CPU seconds of every process named ``postgres*`` on the machine, with the CPU of their
    children that ended (a backend of a closed connection is reaped by the postmaster, and its
    time moves to the postmaster's ``cutime``/``cstime``)."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:  # the process ended meanwhile
            continue
        if not raw[raw.find("(") + 1:].startswith("postgres"):
            continue
        fields = raw.rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
    return total / _TCK


def machine_busy_seconds() -> float:
    """CPU seconds the machine's cores spent not idle (``/proc/stat``: every state but idle and
    iowait), summed over cores."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(values) - values[3] - values[4]) / _TCK


def snapshot(server_pids: list[int]) -> dict[str, float]:
    """The ``PARTS`` now, in CPU seconds; ``generator`` is the calling process."""
    return {"machine": machine_busy_seconds(), "generator": time.process_time(),
            "servers": sum(process_seconds(p) for p in server_pids),
            "postgres": postgres_seconds()}


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds each part spent between two snapshots."""
    return {part: after[part] - before[part] for part in before}
