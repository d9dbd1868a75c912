"""Profile ``lockd serve`` under section 1's load (lock cycles) with py-spy (not a test).

Starts one lockd on ``--store`` (``postgres``: a fresh database; ``etcd``; ``sqlite``), drives
closed-loop acquire+release cycles at it (``bench.loadgen``'s ``lockd`` workload, each client
its own lock) and records lockd (and its workers) with ``py-spy record --format raw`` for
``--seconds``; prints the top functions by own and cumulative share of samples, then the
samples by layer (``bench.layers``; with lockd's CPU per cycle measured meanwhile, from
``/proc``, in µs per cycle)::

    python -m bench.profile_lockd [--store postgres] [--clients 32] [--seconds 8]
                                  [--args "--workers 2"] [--raw PATH] [--tree DIR]

``--raw PATH`` keeps py-spy's raw output; ``--tree DIR`` profiles lockd from another source
tree (``PYTHONPATH``), e.g. the "before" tree of ``bench.compare``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
from pathlib import Path

from bench import loadgen
from bench.compare import lockd_server
from bench.cpu import process_seconds
from bench.layers import format_layers
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
    parser.add_argument("--raw", default=None, help="keep py-spy's raw output here")
    parser.add_argument("--tree", default=None, help="source tree of lockd (default: this)")
    args = parser.parse_args(argv)
    ws = Workspace()
    try:
        store = ws.etcd().extra["url"] if args.store == "etcd" else args.store
        env = {"PYTHONPATH": str(Path(args.tree).resolve())} if args.tree else None
        server = lockd_server(ws, store, "lockd-profile", env=env, args=tuple(args.args.split()))
        raw = Path(args.raw).resolve() if args.raw else ws.dir / "profile.txt"
        spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--pid",
                                str(server.pid), "--subprocesses", "--format", "raw",
                                "--duration", str(int(args.seconds)), "--rate", "250",
                                "--output", str(raw), "--nonblocking"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        result: dict = {}
        load = threading.Thread(target=lambda: result.update(loadgen.run_closed(
            {"workload": "lockd", **server.addr(), "warmup": 0.0, "seconds": args.seconds + 1,
             "prefix": "profile"}, args.clients)))
        cpu0 = process_seconds(server.pid)
        load.start()
        spy.wait()
        load.join()
        cpu_ms = (process_seconds(server.pid) - cpu0) * 1000 / max(1, result["cycles"])
        print(f"{result['cycles'] / (args.seconds + 1):.0f} cycles/s while profiling "
              f"({result['errors']} errors, {args.clients} clients, store {args.store}"
              f"{', ' + args.args if args.args else ''}); lockd CPU {cpu_ms:.2f} ms/cycle "
              "(py-spy's sampling included)")
        print(_top(raw, args.top))
        print(format_layers(raw, cpu_ms))
    finally:
        ws.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
