"""Profile ``lockd serve`` under the section-2 handoff load with py-spy (not a test).

Starts one lockd (``--tree``: another source tree via ``PYTHONPATH``) on ``--store``, drives
``--waiters`` clients that contend for one lock, each holding it 1 ms (``bench.loadgen``'s
``handoff``), records lockd with ``py-spy record --format raw`` for ``--seconds`` and prints the
handoff figures, lockd's CPU per grant (``/proc``) and the top functions by own and cumulative
share of samples::

    python -m bench.profile_handoff [--store sqlite] [--tree /tmp/before] [--seconds 6]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
from pathlib import Path

from bench import loadgen
from bench.cpu import process_seconds
from bench.peers import Workspace
from bench.profile_proxy import _top
from bench.report import pct

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_handoff", description=__doc__)
    parser.add_argument("--store", default="sqlite")
    parser.add_argument("--tree", help="lockd source tree (default: this one)")
    parser.add_argument("--waiters", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--no-profile", action="store_true", help="figures only, no py-spy")
    args = parser.parse_args(argv)
    ws = Workspace()
    try:
        env = {"PYTHONPATH": str(Path(args.tree).resolve())} if args.tree else None
        server = ws.lockd(args.store, "profile-handoff", env=env)
        raw = ws.dir / "profile.txt"
        spy = None
        if not args.no_profile:
            spy = subprocess.Popen(
                [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(server.pid),
                 "--format", "raw", "--duration", str(int(args.seconds)), "--rate", "250",
                 "--output", str(raw), "--nonblocking"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        result: dict = {}
        cpu0 = process_seconds(server.pid)
        load = threading.Thread(target=lambda: result.update(loadgen.run("handoff", {
            "peer": "lockd", **server.addr(), "name": "profile/handoff",
            "clients": args.waiters, "warmup": 0.0, "seconds": args.seconds, "hold_ms": 1})))
        load.start()
        load.join()
        cpu = process_seconds(server.pid) - cpu0
        if spy is not None:
            spy.wait()
        h = result["handoffs_ms"]
        print(f"lockd tree {args.tree or 'this'}, {args.store}: {result['grants']} grants in "
              f"{args.seconds:.0f} s, handoff p50 {pct(h, 50):.2f} ms, p99 {pct(h, 99):.2f} ms, "
              f"lockd CPU {1000 * cpu / max(1, result['grants']):.3f} ms/grant, "
              f"errors {result['errors']}")
        if spy is not None:
            print(_top(raw, args.top))
    finally:
        ws.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
