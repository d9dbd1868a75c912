"""Profile ``resource-proxy serve --objects-dir`` under section 10's PUT load with py-spy
(not a test; ``pip install py-spy`` into the venv).

Starts one proxy with a directory blob store on a fresh PostgreSQL database, drives fenced
object PUTs (``bench.objects``' ``proxy_object_put``) and records the proxy with ``py-spy record
--format raw`` for ``--seconds``; prints the top functions by own and by cumulative time::

    python -m bench.profile_objects [--clients 1] [--size 4096] [--seconds 5] [--idle] [--rate 0]

and the proxy's CPU per PUT (user + system of its processes, from ``/proc``).

``--idle`` samples idle threads too (where a single client's wall time goes).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
from pathlib import Path

from bench import loadgen
from bench.peers import Workspace
from bench.profile_proxy import _top

__all__ = ["main"]


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and its children (the proxy's workers)."""
    pids = [pid, *(int(c) for t in Path(f"/proc/{pid}/task").iterdir()
                   for c in (t / "children").read_text().split())]
    total = 0
    for each in pids:
        fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_objects", description=__doc__)
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--idle", action="store_true", help="sample idle threads too")
    parser.add_argument("--args", default="", help="more flags for the proxy")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--rate", type=int, default=500, help="samples/s (0: no py-spy)")
    args = parser.parse_args(argv)
    from lockd.tokens import KeyRing

    ws = Workspace()
    try:
        ring = KeyRing.generate()
        server = ws.proxy(ws.database(), ring.jwks(), "tables: {}\n", name="proxy-objects",
                          args=("--objects-dir", str(ws.dir / "blobs"), *args.args.split()))
        spec = {"workload": "proxy_object_put", **server.addr(), "size": args.size,
                "tokens": [ring.sign(f"bench{i}", 1) for i in range(args.clients)]}
        raw = ws.dir / "profile.txt"
        spy = None if args.rate == 0 else subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--pid",
                                str(server.proc.pid), "--format", "raw",
                                "--duration", str(int(args.seconds)), "--rate", str(args.rate),
                                "--output", str(raw), "--nonblocking", "--subprocesses",
                                *(["--idle"] if args.idle else [])],
                               stdout=subprocess.DEVNULL)
        result: dict = {}
        cpu_before = _cpu_s(server.proc.pid)
        load = threading.Thread(target=lambda: result.update(loadgen.run_closed(
            {**spec, "warmup": 0.0, "seconds": args.seconds + 1}, args.clients)))
        load.start()
        load.join()
        if spy is not None:
            spy.wait()
        cpu = _cpu_s(server.proc.pid) - cpu_before
        print(f"{result['cycles'] / (args.seconds + 1):.0f} PUTs/s while profiling "
              f"({result['errors']} errors); the proxy's CPU (all its processes): "
              f"{1000 * cpu / max(1, result['cycles']):.2f} ms per PUT (inflated by py-spy; "
              "--rate 0 for none)")
        if spy is not None:
            print(_top(raw, args.top))
    finally:
        ws.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
