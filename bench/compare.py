"""Before/after of an optimisation: lockd from another source tree against this one, back to back.

::

    git archive HEAD~1 lockd resource_proxy | (mkdir -p /tmp/before && tar -x -C /tmp/before)
    python -m bench.compare --before /tmp/before --store postgres --clients 8

Starts two ``lockd serve`` processes on the same kind of store (``sqlite``, ``postgres`` or
``etcd``; separate databases / key prefixes), the "before" one with ``PYTHONPATH`` pointing at
the other tree, then alternates closed-loop rounds of lock cycles between them (ABBA order, so
a drift in the machine's load hits both alike). Prints the median cycles/s of each, lockd's CPU
time per cycle (read from ``/proc``, less sensitive to other load than throughput), and the
after/before ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

from bench import loadgen
from bench.peers import Workspace

__all__ = ["main"]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__)
    parser.add_argument("--before", required=True, help="source tree holding lockd/ (old code)")
    parser.add_argument("--store", default="postgres", choices=["sqlite", "postgres", "etcd"])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args(argv)
    before_tree = Path(args.before).resolve()
    if not (before_tree / "lockd" / "__init__.py").exists():
        parser.error(f"{before_tree} holds no lockd package")
    ws = Workspace()
    try:
        if args.store == "etcd":
            url = ws.etcd().extra["url"]
            urls = {"before": url, "after": url + "-after"}
        else:
            urls = {"before": args.store, "after": args.store}
        servers = {
            "before": ws.lockd(urls["before"], "lockd-before",
                               env={"PYTHONPATH": str(before_tree)}),
            "after": ws.lockd(urls["after"], "lockd-after"),
        }
        rates: dict[str, list[float]] = {k: [] for k in servers}
        cpu: dict[str, list[float]] = {k: [] for k in servers}
        for r in range(args.rounds):
            order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
            for key in order:
                server = servers[key]
                c0 = _cpu_seconds(server.pid)
                out = loadgen.run_closed({"workload": "lockd", **server.addr(), "warmup": 0.5,
                                          "seconds": args.seconds, "prefix": "compare"},
                                         args.clients)
                cycles = out["cycles"] * (args.seconds + 0.5) / args.seconds  # warm-up too
                rates[key].append(out["cycles"] / args.seconds)
                cpu[key].append((_cpu_seconds(server.pid) - c0) * 1000 / max(1.0, cycles))
                if out["errors"]:
                    print(f"{key}: {out['errors']} errors, first: {out['first_error']}")
        for key in servers:
            print(f"{key:6s}  {statistics.median(rates[key]):7.0f} cycles/s (rounds "
                  f"{', '.join(f'{x:.0f}' for x in rates[key])}); lockd CPU "
                  f"{statistics.median(cpu[key]):.2f} ms/cycle")
        print(f"after/before: throughput "
              f"{statistics.median(rates['after']) / statistics.median(rates['before']):.2f}×, "
              f"lockd CPU per cycle "
              f"{statistics.median(cpu['after']) / statistics.median(cpu['before']):.2f}×  "
              f"({args.store}, {args.clients} clients, {args.rounds} rounds × {args.seconds:g} s)")
    finally:
        ws.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
