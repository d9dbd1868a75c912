"""``python -m bench.profile_lockd --store sqlite|postgres|etcd``: where lockd's CPU goes under
section 1's load (N keep-alive clients, acquire + release of each client's own lock).

Starts lockd (``--args`` passes more flags), runs the closed loop in a generator process for
``--seconds`` + 2 s, and ``py-spy record``s lockd meanwhile (``--rate`` Hz); prints the cycles/s
while profiled and the top functions by own and cumulative share of samples.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import tempfile
import threading
from pathlib import Path

from bench import loadgen
from bench.peers import VENV_BIN, Workspace

__all__ = ["main", "top"]


def top(raw: Path, n: int = 20) -> tuple[int, list[tuple[str, float]], list[tuple[str, float]]]:
    """(samples, own-time top, cumulative top) of a py-spy ``--format raw`` file."""
    own: collections.Counter[str] = collections.Counter()
    cum: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        k = int(count)
        total += k
        frames = stack.split(";")
        own[_short(frames[-1])] += k
        for f in set(map(_short, frames)):
            cum[f] += k
    return (total, [(f, 100 * v / total) for f, v in own.most_common(n)],
            [(f, 100 * v / total) for f, v in cum.most_common(n)])


def _short(frame: str) -> str:
    name, _, where = frame.partition(" (")
    file = where.split(":")[0].rsplit("/", 1)[-1]
    return f"{name} {file}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_lockd", description=__doc__)
    parser.add_argument("--store", default="sqlite", choices=["sqlite", "postgres", "etcd"])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rate", type=int, default=250)
    parser.add_argument("--args", default="", help="more flags for lockd serve")
    args = parser.parse_args(argv)
    ws = Workspace()
    try:
        store = ws.etcd().extra["url"] if args.store == "etcd" else args.store
        server = ws.lockd(store, "lockd-profiled", args=tuple(args.args.split()))
        out: dict = {}
        load = threading.Thread(target=lambda: out.update(loadgen.run_closed(
            {"workload": "lockd", **server.addr(), "warmup": 1.0, "seconds": args.seconds + 1,
             "prefix": "profile"}, args.clients)))
        load.start()
        with tempfile.TemporaryDirectory() as tmp:
            raw = Path(tmp) / "profile.txt"
            subprocess.run([str(VENV_BIN / "py-spy"), "record", "--pid", str(server.pid),
                            "--duration", str(int(args.seconds)), "--rate", str(args.rate),
                            "--format", "raw", "--output", str(raw), "--nonblocking"],
                           check=True, capture_output=True, timeout=args.seconds + 60)
            load.join()
            total, own, cum = top(raw)
        print(f"{out['cycles'] / out['seconds']:.0f} cycles/s while profiling "
              f"({out['errors']} errors); {total} samples; own time:")
        for f, share in own:
            print(f"  {share:5.1f}%  {f}")
        print("cumulative:")
        for f, share in cum:
            print(f"  {share:5.1f}%  {f}")
    finally:
        ws.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
