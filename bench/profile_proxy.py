"""Profile ``resource-proxy serve`` under the section-5 load with py-spy (not a test).

Starts one proxy on a fresh PostgreSQL database, drives fenced single-row PUTs at it
(``bench.loadgen``'s ``proxy_write``; ``--fresh``: a new token every write) and records the
proxy's workers with ``py-spy record --format raw`` for ``--seconds``; prints the top functions
by own time and by cumulative time (share of samples)::

    python -m bench.profile_proxy [--clients 8] [--seconds 8] [--fresh] [--args "--workers 2"]

``--tree DIR`` profiles the proxy of another source tree (e.g. ``git archive`` of main) instead;
``--args`` does not reach it (set ``PROXY_WORKERS`` in the environment for its worker count).
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import threading
from pathlib import Path

from bench import loadgen
from bench.compare import _fresh, _proxy_servers
from bench.peers import Workspace

__all__ = ["main"]


def _top(raw: Path, n: int) -> str:
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        k = int(count)
        samples += k
        frames = [f.split(" (")[0] + " " + f.split(" (")[-1].split(":")[0].rsplit("/", 1)[-1]
                  for f in stack.split(";")]
        own[frames[-1]] += k
        for f in set(frames):
            total[f] += k
    out = [f"{samples} samples; own time:"]
    out += [f"  {100 * c / samples:5.1f}%  {f}" for f, c in own.most_common(n)]
    out.append("cumulative:")
    out += [f"  {100 * c / samples:5.1f}%  {f}" for f, c in total.most_common(n)]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_proxy", description=__doc__)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--fresh", action="store_true", help="a new token every write")
    parser.add_argument("--args", default="", help="more flags for the proxy")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--tree", default=None, help="source tree of the proxy (default: this)")
    args = parser.parse_args(argv)
    ws = Workspace()
    try:
        tree = Path(args.tree or Path(__file__).resolve().parents[1]).resolve()
        servers, specs, ring = _proxy_servers(ws, tree, args.args.split(), args.clients)
        key = "before" if args.tree else "after"  # "before" runs with PYTHONPATH=tree
        spec = specs[key]
        if args.fresh:
            spec = _fresh(spec, ring, 0, args.clients, args.seconds)
        raw = ws.dir / "profile.txt"
        spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--pid",
                                str(servers[key].pid), "--subprocesses", "--format", "raw",
                                "--duration", str(int(args.seconds)), "--rate", "250",
                                "--output", str(raw), "--nonblocking"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        result: dict = {}
        load = threading.Thread(target=lambda: result.update(loadgen.run_closed(
            {**spec, "warmup": 0.0, "seconds": args.seconds + 1}, args.clients)))
        load.start()
        spy.wait()
        load.join()
        print(f"{result['cycles'] / (args.seconds + 1):.0f} writes/s while profiling "
              f"({result['errors']} errors)")
        print(_top(raw, args.top))
    finally:
        ws.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
