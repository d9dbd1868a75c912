"""Count the proxy's system calls per write under the section-5 load (not a test).

Starts one proxy on a fresh PostgreSQL database (this tree, or ``--tree``), drives fenced
single-row PUTs at it (``bench.loadgen``'s ``proxy_write``; ``--fresh``: a new token every
write), attaches ``strace -c -f`` to the proxy for ``--seconds`` and prints strace's summary
with the calls per write (writes counted by the load generator over the same window)::

    python -m bench.syscalls_proxy [--clients 8] [--seconds 2] [--fresh] [--tree /tmp/before]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

from bench import loadgen
from bench.compare import _fresh
from bench.peers import Workspace

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.syscalls_proxy", description=__doc__)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--fresh", action="store_true", help="a new token every write")
    parser.add_argument("--tree", default=None, help="source tree of the proxy (default: this)")
    parser.add_argument("--args", default="--workers 1", help="flags for the proxy")
    args = parser.parse_args(argv)
    strace = shutil.which("strace")
    if strace is None:
        parser.error("strace is not installed (apt-get install strace)")
    ws = Workspace()
    try:
        import psycopg

        from lockd.tokens import KeyRing

        ring = KeyRing.generate()
        dsn = ws.database()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE bench_rows (id bigint PRIMARY KEY, v bigint NOT NULL)")
            conn.execute("INSERT INTO bench_rows SELECT g, 0 FROM generate_series(0, 99999) g")
        env = {"PYTHONPATH": str(Path(args.tree).resolve())} if args.tree else None
        server = ws.proxy(dsn, ring.jwks(), "tables: {bench_rows: 'cmp/{key}'}\n", "proxy",
                          env=env, args=tuple(args.args.split()))
        spec = {"workload": "proxy_write", **server.addr(), "table": "bench_rows",
                "tokens": [ring.sign(f"cmp/{i}", 1) for i in range(args.clients)]}
        if args.fresh:
            spec = _fresh(spec, ring, 0, args.clients, args.seconds + 2)
        result: dict = {}
        load = threading.Thread(target=lambda: result.update(loadgen.run_closed(
            {**spec, "warmup": 0.0, "seconds": args.seconds + 2}, args.clients)))
        load.start()
        time.sleep(1.0)
        trace = subprocess.run(["timeout", "-s", "INT", str(args.seconds), strace, "-c", "-f",
                                "-p", str(server.pid)], capture_output=True, text=True)
        load.join()
        writes = result["cycles"] * args.seconds / (args.seconds + 2)
        print(f"~{writes:.0f} writes in the {args.seconds:g} s traced ({result['errors']} errors)")
        print(trace.stderr)
        total = re.search(r"^\s*100\.00\s+\S+\s+\S+\s+(\d+)", trace.stderr, re.M)
        sends = re.search(r"^\s*\S+\s+\S+\s+\S+\s+(\d+)\s+(?:\d+\s+)?sendto$", trace.stderr, re.M)
        if total and sends:  # one sendto (the statement to PostgreSQL) per write
            print(f"{int(total.group(1)) / int(sends.group(1)):.1f} system calls per write "
                  "(per sendto of a statement to PostgreSQL)")
    finally:
        ws.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
