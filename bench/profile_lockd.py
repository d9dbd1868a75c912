"""Profile ``lockd serve`` under section 1's load (lock cycles) with py-spy (not a test).

Starts one lockd on ``--store`` (``postgres``: a fresh database; ``etcd``; ``sqlite``), drives
closed-loop acquire+release cycles at it (``bench.loadgen``'s ``lockd`` workload, each client
its own lock) and records lockd (and its workers) with ``py-spy record --format raw`` for
``--seconds``; prints the top functions by own and cumulative share of samples::

    python -m bench.profile_lockd [--store postgres] [--clients 32] [--seconds 8]
                                  [--args "--workers 2"]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
from pathlib import Path

from bench import loadgen
from bench.compare import lockd_server
from bench.peers import Workspace
from bench.profile_proxy import _top

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_lockd", description=__doc__)
    parser.add_argument("--store", default="postgres", choices=["sqlite", "postgres", "etcd"])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--args", default="", help="more flags for lockd serve")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    ws = Workspace()
    try:
        store = ws.etcd().extra["url"] if args.store == "etcd" else args.store
        server = lockd_server(ws, store, "lockd-profile", args=tuple(args.args.split()))
        raw = ws.dir / "profile.txt"
        spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--pid",
                                str(server.pid), "--subprocesses", "--format", "raw",
                                "--duration", str(int(args.seconds)), "--rate", "250",
                                "--output", str(raw), "--nonblocking"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        result: dict = {}
        load = threading.Thread(target=lambda: result.update(loadgen.run_closed(
            {"workload": "lockd", **server.addr(), "warmup": 0.0, "seconds": args.seconds + 1,
             "prefix": "profile"}, args.clients)))
        load.start()
        spy.wait()
        load.join()
        print(f"{result['cycles'] / (args.seconds + 1):.0f} cycles/s while profiling "
              f"({result['errors']} errors, {args.clients} clients, store {args.store}"
              f"{', ' + args.args if args.args else ''})")
        print(_top(raw, args.top))
    finally:
        ws.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
