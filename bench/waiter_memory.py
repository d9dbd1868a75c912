"""What one queued acquire costs lockd in memory, and where it goes.

::

    python -m bench.waiter_memory [--tree /tmp/before] [--store postgres] [--waiters 1000]
                                  [--trace] [--top 25]

Starts ``lockd serve`` (from ``--tree`` via ``PYTHONPATH``, default this tree) under a small
wrapper whose thread answers a request file with a report of the process: RSS (``/proc``), live objects by
type (``gc``), and with ``--trace`` a ``tracemalloc`` snapshot (traced from
before lockd is imported, 12 frames; slows lockd, so its RSS is not comparable with a run
without ``--trace``). Then it warms lockd up (one round of ``--warm`` waiters queued and served, so
first-use costs: pools, caches, lazily built validators, are paid), takes report A,
queues ``--waiters`` acquires over 10 locks (each on its own connection, confirmed queued),
takes report B, and serves them (``--idle``: instead opens ``--waiters`` connections that
send nothing: the HTTP server's share of a waiter). Prints
B - A per waiter: RSS bytes, objects by type, and the
top allocation sites (``--trace``).

Section 7 counts the same way (RSS queued - RSS idle after a warm-up round of 20 waiters) and
keeps the figure from the fresh lockd beside it; this tool adds where the bytes go.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["WARM_WAITERS", "main"]

# The warm-up round before the measured one: every code path of a wait once, without raising
# the heap's high-water mark. Section 7 of ``make bench`` uses the same round.
WARM_WAITERS = 20

_WRAPPER = r'''
import gc, json, os, sys, threading, time, tracemalloc
trace = os.environ.get("WAITER_MEMORY_TRACE") == "1"
if trace:
    tracemalloc.start(12)
out = os.environ["WAITER_MEMORY_OUT"]

def report(n):
    gc.collect()
    types = {}
    for obj in gc.get_objects():
        t = type(obj)
        name = f"{getattr(t, '__module__', '?')}.{t.__qualname__}"
        if name == "builtins.coroutine":
            name = f"coroutine {obj.__qualname__} ({sys.getsizeof(obj)} B)"
        types[name] = types.get(name, 0) + 1
    rss = 0
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
    path = f"{out}.{n}"
    if trace:
        tracemalloc.take_snapshot().dump(path + ".trace")
    with open(path + ".json", "w") as fh:
        json.dump({"rss": rss, "types": types}, fh)
    with open(path + ".done", "w"):
        pass

def watch():  # a request file per report; this thread holds the GIL while it reports
    n = 1
    while True:
        if os.path.exists(f"{out}.{n}.req"):
            report(n)
            n += 1
        time.sleep(0.05)

threading.Thread(target=watch, daemon=True).start()
from lockd.server.cli import main
sys.exit(main(sys.argv[1:]))
'''


async def _queue(host: str, port: int, prefix: str, waiters: int, locks: int,
                 on_queued) -> None:
    from bench.loadgen import Http, HttpError

    admin = await Http(host, port).connect()
    gates = [(await admin.json("POST", f"/v1/locks/{prefix}/{j}/acquire",
                               {"ttl_ms": 300_000, "owner": "gate"}))["lease_id"]
             for j in range(locks)]
    conns = [Http(host, port) for _ in range(waiters)]
    for lo in range(0, waiters, 200):
        await asyncio.gather(*(c.connect() for c in conns[lo:lo + 200]))

    async def waiter(k: int) -> None:
        j = k % locks
        body = json.dumps({"ttl_ms": 60_000, "wait_ms": 290_000, "owner": f"w{k}"}).encode()
        status, data = await conns[k].request("POST", f"/v1/locks/{prefix}/{j}/acquire", body)
        assert status == 200, (status, data)
        status, _ = await conns[k].request(
            "POST", f"/v1/locks/{prefix}/{j}/release",
            json.dumps({"lease_id": json.loads(data)["lease_id"]}).encode())
        assert status == 200

    tasks = []
    for k in range(waiters):
        tasks.append(asyncio.ensure_future(waiter(k)))
        want = k // locks + 1
        for _ in range(5000):
            state = await admin.json("GET", f"/v1/locks/{prefix}/{k % locks}")
            if state["waiters"] >= want:
                break
            await asyncio.sleep(0.001)
        else:
            raise RuntimeError(f"waiter {k} never showed up queued")
    on_queued()
    for j, lease_id in enumerate(gates):
        for attempt in (1, 2):  # the admin connection may have idled out during a report
            try:
                await admin.json("POST", f"/v1/locks/{prefix}/{j}/release",
                                 {"lease_id": lease_id})
                break
            except HttpError as exc:
                if exc.status != 0 or attempt == 2:
                    raise
    await asyncio.gather(*tasks)
    for c in conns:
        await c.close()
    await admin.close()


async def _idle(host: str, port: int, count: int, on_open) -> None:
    """``count`` connections opened and held without a request (lockd is started with a
    request timeout of 600 s, so none is closed before the report)."""
    from bench.loadgen import Http

    conns = [Http(host, port) for _ in range(count)]
    for lo in range(0, count, 200):
        await asyncio.gather(*(c.connect() for c in conns[lo:lo + 200]))
    await asyncio.sleep(0.5)  # every connection accepted
    on_open()
    for c in conns:
        await c.close()


def _report(pid: int, out: str, n: int) -> dict:
    Path(f"{out}.{n}.req").touch()
    done = Path(f"{out}.{n}.done")
    for _ in range(6000):
        if done.exists():
            break
        time.sleep(0.01)
    return json.loads(Path(f"{out}.{n}.json").read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.waiter_memory")
    parser.add_argument("--tree", help="source tree of lockd (default: this one)")
    parser.add_argument("--store", default="postgres")
    parser.add_argument("--waiters", type=int, default=1000)
    parser.add_argument("--locks", type=int, default=10)
    parser.add_argument("--warm", type=int, default=WARM_WAITERS,
                        help=f"waiters of the warm-up round (default {WARM_WAITERS}: every code "
                             "path once, without raising the heap's high-water mark)")
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--idle", action="store_true",
                        help="measure open connections that sent nothing instead of queued "
                             "acquires: the HTTP server's share of a waiter")
    args = parser.parse_args(argv)

    from bench.peers import VENV_BIN, Workspace

    ws = Workspace()
    tmp = Path(tempfile.mkdtemp(prefix="waiter-memory-"))
    out = str(tmp / "report")
    wrapper = tmp / "wrapper.py"
    wrapper.write_text(_WRAPPER)
    env = {"WAITER_MEMORY_OUT": out, "WAITER_MEMORY_TRACE": "1" if args.trace else "0",
           "LOCKD_MAX_CONNECTIONS": str(args.waiters * 2 + 100),
           "LOCKD_REQUEST_TIMEOUT_MS": "600000"}  # idle pre-opened connections, slow tracing
    if args.tree:
        env["PYTHONPATH"] = str(Path(args.tree).resolve())
    # Workspace.lockd runs the ``lockd`` console script; run the wrapper with the same argv.
    real = VENV_BIN / "lockd"
    shim = tmp / "lockd"
    shim.write_text(f"#!/bin/sh\nexec {VENV_BIN / 'python'} {wrapper} \"$@\"\n")
    shim.chmod(0o755)
    import bench.peers as peers

    peers.VENV_BIN = tmp  # type: ignore[misc]
    try:
        server = ws.lockd(args.store, "waiter-memory", env=env)
    finally:
        peers.VENV_BIN = real.parent  # type: ignore[misc]
    pid = server.pid
    host, port = server.addr()["host"], server.addr()["port"]
    try:
        asyncio.run(_queue(host, port, "warm", args.warm, args.locks, lambda: None))
        a = _report(pid, out, 1)
        if args.idle:
            asyncio.run(_idle(host, port, args.waiters,
                              lambda: reports.append(_report(pid, out, 2))))
        else:
            asyncio.run(_queue(host, port, "measure", args.waiters, args.locks,
                               lambda: reports.append(_report(pid, out, 2))))
    finally:
        server.stop()
        ws.close()
    b = reports[0]
    n = args.waiters
    what = (f"{n} open connections that sent nothing" if args.idle
            else f"{n} waiters over {args.locks} locks")
    print(f"lockd tree: {args.tree or 'this'}; store {args.store}; {what}; "
          f"tracemalloc {'on' if args.trace else 'off'}")
    print(f"RSS: warm idle {a['rss'] / 2**20:.1f} MiB, queued {b['rss'] / 2**20:.1f} MiB: "
          f"{(b['rss'] - a['rss']) / n:,.0f} bytes per waiter")
    diff = {k: b["types"].get(k, 0) - a["types"].get(k, 0)
            for k in set(a["types"]) | set(b["types"])}
    print("gc-tracked objects per waiter (B - A) / waiters:")
    for name, d in sorted(diff.items(), key=lambda kv: -kv[1])[:args.top]:
        if d / n >= 0.5:
            print(f"  {d / n:6.2f}  {name}")
    print(f"  total {sum(diff.values()) / n:.1f} per waiter")
    if args.trace:
        import tracemalloc

        sa = tracemalloc.Snapshot.load(f"{out}.1.trace")
        sb = tracemalloc.Snapshot.load(f"{out}.2.trace")
        stats = sb.compare_to(sa, "traceback")
        total = sum(s.size_diff for s in stats)
        print(f"tracemalloc: {total / n:,.0f} bytes per waiter traced (Python allocations)")
        by_line = sb.compare_to(sa, "lineno")
        print("top allocation lines (bytes per waiter, count per waiter):")
        for s in by_line[:args.top]:
            frame = s.traceback[0]
            print(f"  {s.size_diff / n:8.0f}  {s.count_diff / n:6.2f}  "
                  f"{frame.filename.split('site-packages/')[-1]}:{frame.lineno}")
        print("top tracebacks (bytes per waiter):")
        for s in stats[:8]:
            print(f"  {s.size_diff / n:8.0f} B  {s.count_diff / n:6.2f} blocks")
            for frame in s.traceback.format()[-12:]:
                print("     " + frame.strip()[:150])
    return 0


reports: list[dict] = []

if __name__ == "__main__":
    sys.exit(main())
