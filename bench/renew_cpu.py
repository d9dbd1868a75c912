"""Renewal cost in server CPU: leases kept alive per second of the server's CPU (not a test).

Section 4's schedule (``bench.loadgen``'s ``renewals``: every lease renewed every
``--period-ms``, phases spread evenly) at one lease count, against etcd's own keep-alive
(``/v3/lease/keepalive``, one request per lease), lockd's single renew (one request per lease)
and lockd's ``POST /v1/leases/renew-each`` (clients of ``--batch`` leases, one request per
client per tick), on SQLite and PostgreSQL. CPU is the server process's (``/proc``), taken as
the difference between a run of ``--seconds`` and one of three times as long: the marginal CPU
of the extra renewals, without the grants and releases around them. "leases per CPU-second" is
how many leases one second of the server's CPU keeps renewed at this period::

    python -m bench.renew_cpu [--leases 500] [--period-ms 1000] [--seconds 2] [--batch 1000]
"""

from __future__ import annotations

import argparse

from bench import loadgen
from bench.cpu import process_seconds
from bench.peers import Workspace

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.renew_cpu", description=__doc__)
    parser.add_argument("--leases", type=int, default=500)
    parser.add_argument("--period-ms", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--batch", type=int, default=1000)
    args = parser.parse_args(argv)
    ws = Workspace()
    try:
        etcd = ws.etcd()
        rows = [("etcd keep-alive", "etcd", etcd)]
        for store, label in (("sqlite", "SQLite"), ("postgres", "PostgreSQL")):
            server = ws.lockd(store, f"lockd-{store}")
            rows += [(f"lockd · {label}, single renew", "lockd", server),
                     (f"lockd · {label}, renew-each", "lockd-each", server)]
        base = None
        for n, (label, peer, server) in enumerate(rows):
            cpu: list[float] = []
            counts: list[int] = []
            outs: list[dict] = []
            for k, seconds in enumerate((args.seconds, 3 * args.seconds)):
                spec = {"peer": peer, **server.addr(), "leases": args.leases,
                        "period_ms": args.period_ms, "ttl_ms": int(args.period_ms * 3),
                        "seconds": seconds, "prefix": f"renew-cpu/{n}/{k}", "connections": 64,
                        "batch": args.batch}
                c0 = process_seconds(server.pid)
                outs.append(loadgen.run("renewals", spec))
                cpu.append(process_seconds(server.pid) - c0)
                counts.append(len(outs[-1]["lat_ms"]))
            out = outs[-1]
            cpu_per_renewal = (cpu[1] - cpu[0]) / max(1, counts[1] - counts[0])  # seconds
            per_cpu = 1 / max(1e-12, cpu_per_renewal * 1000 / args.period_ms)
            base = per_cpu if base is None else base
            lat = sorted(out["lat_ms"])
            p99 = lat[int(0.99 * (len(lat) - 1))] if lat else float("nan")
            print(f"{label:38s} {counts[1]:6d}/{out['expected']} renewals, misses {out['misses']}, "
                  f"errors {out['errors']}; server CPU {cpu_per_renewal * 1e6:6.1f} µs per "
                  f"renewal; p99 {p99:6.1f} ms; ~{per_cpu:8.0f} leases per "
                  f"CPU-second ({per_cpu / base:.2f}× etcd)"
                  + (f"; first error: {out['first_error']}" if out['errors'] else ""))
    finally:
        ws.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
