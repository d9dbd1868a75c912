"""lockd's CPU per lock cycle split by thread, user and system, with context switches (not a test).

py-spy counts a thread that is runnable but preempted (on this shared 2-core machine: after
nearly every ``send`` that wakes a client) or waiting in ``fdatasync`` as busy, so its shares
overstate system calls. This reads what the kernel charged instead: ``/proc/PID/task/*/stat``
(user and system ticks) and ``status`` (voluntary and involuntary context switches) of every
thread of one ``lockd serve`` before and after ``--seconds`` of section 1's closed-loop lock
cycles (``bench.loadgen``'s ``lockd`` workload, each client its own lock)::

    python -m bench.threads_cpu [--store sqlite|postgres] [--clients 8] [--seconds 6] [--tree DIR]

One line per thread that ran (the event loop's, the SQLite store's), then the total, all in
µs (or switches) per cycle. ``--tree DIR`` runs lockd from another source tree (``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from bench import loadgen
from bench.compare import lockd_server
from bench.peers import Workspace

__all__ = ["main"]


def _threads(pid: int) -> dict[str, tuple[int, int, int, int]]:
    """Per thread id: (user ticks, system ticks, voluntary, involuntary context switches)."""
    out: dict[str, tuple[int, int, int, int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
            status = (task / "status").read_text()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split()
        switches = [int(line.split()[1]) for line in status.splitlines()
                    if "ctxt_switches:" in line]  # voluntary_..., then nonvoluntary_...
        out[task.name] = (int(fields[11]), int(fields[12]), switches[0], switches[1])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.threads_cpu", description=__doc__)
    parser.add_argument("--store", default="sqlite", choices=["sqlite", "postgres"])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--tree", default=None, help="source tree of lockd (default: this)")
    args = parser.parse_args(argv)
    ws = Workspace()
    try:
        env = {"PYTHONPATH": str(Path(args.tree).resolve())} if args.tree else None
        server = lockd_server(ws, args.store, "lockd-threads", env=env)
        before = _threads(server.pid)
        result = loadgen.run_closed({"workload": "lockd", **server.addr(), "warmup": 0.0,
                                     "seconds": args.seconds, "prefix": "threads"}, args.clients)
        after = _threads(server.pid)
        cycles = max(1, result["cycles"])
        tick_us = 1e6 / os.sysconf("SC_CLK_TCK") / cycles
        total = [0, 0]
        for tid, (user, system, vol, invol) in after.items():
            u0, s0, v0, i0 = before.get(tid, (0, 0, 0, 0))
            user, system = user - u0, system - s0
            if user + system == 0:
                continue
            total[0] += user
            total[1] += system
            print(f"thread {tid:>7}: user {user * tick_us:6.1f} µs  system {system * tick_us:6.1f}"
                  f" µs  switches {(vol - v0) / cycles:.2f} voluntary, "
                  f"{(invol - i0) / cycles:.2f} involuntary per cycle")
        print(f"total: {(total[0] + total[1]) * tick_us:.1f} µs per cycle (user "
              f"{total[0] * tick_us:.1f}, system {total[1] * tick_us:.1f}); "
              f"{result['cycles'] / args.seconds:.0f} cycles/s, {result['errors']} errors "
              f"({args.store}, {args.clients} clients)")
    finally:
        ws.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
