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

``--workload shared``, ``permit`` or ``campaign`` times a shared lock's, a semaphore permit's
(limit 2) or an election's (campaign + resign) cycle instead of an exclusive lock's.
``--workload proxy`` (or ``proxy-fresh``: a token the proxy has not seen on every write) does
the same for ``resource-proxy serve``: two proxies, each on its own fresh PostgreSQL database,
fenced single-row PUTs (``bench.loadgen``'s ``proxy_write``); CPU is the proxy's whole process
tree (its workers too). ``--after-args "--workers 2"`` passes flags to the "after" server
only, for either workload (lockd's CPU is then its whole process tree as well)::

    python -m bench.compare --before /tmp/before --workload proxy --clients 8
    python -m bench.compare --before /tmp/before --store postgres --after-args "--workers 2"
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from bench import loadgen
from bench.cpu import process_seconds
from bench.peers import Server, Workspace
from harness import VENV_BIN, ServiceProcess, free_port, sqlalchemy_url

__all__ = ["main"]


def lockd_server(ws: Workspace, store: str, name: str, env: dict[str, str] | None = None,
                 args: tuple[str, ...] = ()) -> Server:
    """``lockd serve`` on ``store`` (``sqlite``, ``postgres`` or a store URL) with more flags
    ``args`` (``--workers 2``); ``Workspace.lockd`` without TLS, plus the flags."""
    if not args:
        return ws.lockd(store, name, env=env)
    if store == "sqlite":
        url = f"sqlite:///{ws.dir / f'{name}.db'}"
    elif store == "postgres":
        url = sqlalchemy_url(ws.database())
    else:
        url = store
    port = free_port()
    argv = [str(VENV_BIN / "lockd"), "serve", "--store", url, "--port", str(port),
            "--key-dir", str(ws.dir / "keys"), "--log-level", "warning", *args]
    proc = ServiceProcess(argv, ready_url=f"http://127.0.0.1:{port}/healthz", env=env,
                          log_path=ws.dir / f"{name}.log").start(timeout=60)
    server = Server(name, "127.0.0.1", port, proc, {"store": url})
    ws.servers.append(server)
    return server


def _proxy_servers(ws: Workspace, before_tree: Path, after_args: list[str], clients: int):
    """Two proxies (before/after) on fresh databases, and the load spec of each."""
    import psycopg

    from lockd.tokens import KeyRing

    ring = KeyRing.generate()
    servers, specs = {}, {}
    for key in ("before", "after"):
        dsn = ws.database()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE bench_rows (id bigint PRIMARY KEY, v bigint NOT NULL)")
            conn.execute("INSERT INTO bench_rows SELECT g, 0 FROM generate_series(0, 99999) g")
        env = {"PYTHONPATH": str(before_tree)} if key == "before" else None
        args = tuple(after_args) if key == "after" else ()
        servers[key] = ws.proxy(dsn, ring.jwks(), "tables: {bench_rows: 'cmp/{key}'}\n",
                                f"proxy-{key}", env=env, args=args)
        specs[key] = {"workload": "proxy_write", **servers[key].addr(), "table": "bench_rows",
                      "tokens": [ring.sign(f"cmp/{i}", 1) for i in range(clients)]}
    return servers, specs, ring


def _fresh(spec: dict, ring, round_: int, clients: int, seconds: float) -> dict:
    """``spec`` with a new token (new row, so new lock) for every write of this round."""
    per_client = int(400 * (seconds + 0.5)) + 100  # more than a client can send
    base = 1000 + round_ * 100 * clients  # new rows, so new locks: fences 1, 2, 3, ...
    return {**spec, "row_base": base, "fresh_tokens": [
        [ring.sign(f"cmp/{base + i}", f) for f in range(1, per_client + 1)]
        for i in range(clients)]}


_LOCK_SPEC = {"workload": "lockd", "prefix": "compare"}
_PRIMITIVE_SPECS = {  # bench.primitives' cycles, each client on its own name
    "shared": {"workload": "lockd_prim", "kind": "lock", "mode": "shared", "prefix": "cmp-s"},
    "permit": {"workload": "lockd_prim", "kind": "sem", "limit": 2, "prefix": "cmp-p"},
    "campaign": {"workload": "lockd_prim", "kind": "election", "prefix": "cmp-e"},
}
"""``--workload``: lock cycles (default), shared-lock cycles, semaphore permits, elections
(campaign + resign)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__)
    parser.add_argument("--before", required=True, help="source tree holding lockd/ (old code)")
    parser.add_argument("--store", default="postgres", choices=["sqlite", "postgres", "etcd"])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--workload", default="lockd",
                        choices=["lockd", *_PRIMITIVE_SPECS, "proxy", "proxy-fresh"])
    parser.add_argument("--after-args", default="", help="more flags for the 'after' server "
                        "(lockd or proxy), e.g. '--workers 2'")
    parser.add_argument("--before-env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable of the 'before' lockd (repeatable), e.g. "
                        "LOCKD_PG_BATCH=0 with --before set to this tree")
    args = parser.parse_args(argv)
    before_tree = Path(args.before).resolve()
    if not (before_tree / "lockd" / "__init__.py").exists():
        parser.error(f"{before_tree} holds no lockd package")
    ws = Workspace()
    try:
        if args.workload in ("proxy", "proxy-fresh"):
            return _compare_proxy(args, ws, before_tree)
        if args.store == "etcd":
            url = ws.etcd().extra["url"]
            urls = {"before": url, "after": url + "-after"}
        else:
            urls = {"before": args.store, "after": args.store}
        servers = {
            "before": ws.lockd(urls["before"], "lockd-before",
                               env={"PYTHONPATH": str(before_tree),
                                    **dict(e.split("=", 1) for e in args.before_env)}),
            "after": lockd_server(ws, urls["after"], "lockd-after",
                                  args=tuple(args.after_args.split())),
        }
        rates: dict[str, list[float]] = {k: [] for k in servers}
        cpu: dict[str, list[float]] = {k: [] for k in servers}
        for r in range(args.rounds):
            order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
            for key in order:
                server = servers[key]
                c0 = process_seconds(server.pid)
                out = loadgen.run_closed({**_PRIMITIVE_SPECS.get(args.workload, _LOCK_SPEC),
                                          **server.addr(), "warmup": 0.5,
                                          "seconds": args.seconds}, args.clients)
                cycles = out["cycles"] * (args.seconds + 0.5) / args.seconds  # warm-up too
                rates[key].append(out["cycles"] / args.seconds)
                cpu[key].append((process_seconds(server.pid) - c0) * 1000 / max(1.0, cycles))
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
              f"({args.workload} cycles, {args.store}, {args.clients} clients, {args.rounds} "
              f"rounds × {args.seconds:g} s"
              f"{', after: ' + args.after_args if args.after_args else ''}"
              f"{', before: ' + ' '.join(args.before_env) if args.before_env else ''})")
    finally:
        ws.close()
    return 0


def _compare_proxy(args, ws: Workspace, before_tree: Path) -> int:
    servers, specs, ring = _proxy_servers(ws, before_tree, args.after_args.split(),
                                          args.clients)
    rates: dict[str, list[float]] = {k: [] for k in servers}
    cpu: dict[str, list[float]] = {k: [] for k in servers}
    for r in range(args.rounds):
        order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
        for key in order:
            spec = specs[key]
            if args.workload == "proxy-fresh":
                spec = _fresh(spec, ring, r, args.clients, args.seconds)
            c0 = process_seconds(servers[key].pid)
            out = loadgen.run_closed({**spec, "warmup": 0.5, "seconds": args.seconds},
                                     args.clients)
            writes = out["cycles"] * (args.seconds + 0.5) / args.seconds  # warm-up too
            rates[key].append(out["cycles"] / args.seconds)
            cpu[key].append((process_seconds(servers[key].pid) - c0) * 1000 / max(1.0, writes))
            if out["errors"]:
                print(f"{key}: {out['errors']} errors, first: {out['first_error']}")
    for key in servers:
        print(f"{key:6s}  {statistics.median(rates[key]):7.0f} writes/s (rounds "
              f"{', '.join(f'{x:.0f}' for x in rates[key])}); proxy CPU "
              f"{statistics.median(cpu[key]):.3f} ms/write")
    print(f"after/before: throughput "
          f"{statistics.median(rates['after']) / statistics.median(rates['before']):.2f}×, "
          f"proxy CPU per write "
          f"{statistics.median(cpu['after']) / statistics.median(cpu['before']):.2f}×  "
          f"({args.workload}, {args.clients} clients, {args.rounds} rounds × {args.seconds:g} s"
          f"{', after: ' + args.after_args if args.after_args else ''})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
