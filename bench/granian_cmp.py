"""uvicorn (what lockd and the proxy serve with) against Granian (a Rust HTTP server for ASGI)
on lockd's and the proxy's hot paths, side by side in one run (not a test; Granian is an
optional dependency: ``pip install -e '.[granian]'``)::

    python -m bench.granian_cmp [--clients 8,32] [--rounds 6] [--seconds 2]

lockd on a fresh PostgreSQL database: ``lockd serve`` (uvicorn, uvloop, lockd's own protocol)
against the same app (``create_app``, settings from ``LOCKD_*``) under ``granian --interface
asgi --loop uvloop --workers 1``; section 1's lock cycles (acquire + release). The proxy:
``resource-proxy serve --workers 1`` against its app under Granian, fenced single-row PUTs with
a cached token (section 5's load). Rounds alternate ABBA; medians of cycles/s, server CPU per
cycle (from ``/proc``, the whole process tree: Granian runs its worker as a child) and p99.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from bench import loadgen
from bench.compare import _proxy_servers
from bench.cpu import process_seconds
from bench.peers import Server, Workspace
from harness import VENV_BIN, ServiceProcess, free_port, sqlalchemy_url

__all__ = ["main"]

# The app factory for Granian (``--factory``): lockd reads its settings from ``LOCKD_*``.
LOCKD_FACTORY = "lockd.server.app:create_app"


def proxy_app():  # pragma: no cover - run by Granian
    """The proxy app with settings from ``PROXY_*`` (``create_app`` needs them passed)."""
    from resource_proxy.app import create_app
    from resource_proxy.settings import Settings

    return create_app(Settings())


def _granian(ws: Workspace, name: str, target: str, env: dict[str, str]) -> Server:
    port = free_port()
    argv = [str(VENV_BIN / "granian"), "--interface", "asgi", "--loop", "uvloop",
            "--workers", "1", "--host", "127.0.0.1", "--port", str(port), "--factory",
            "--log-level", "warning", "--no-ws", target]
    proc = ServiceProcess(argv, ready_url=f"http://127.0.0.1:{port}/healthz",
                          env={**env, "PYTHONPATH": os.getcwd()},
                          log_path=ws.dir / f"{name}.log").start(timeout=60)
    server = Server(name, "127.0.0.1", port, proc)
    ws.servers.append(server)
    return server


def _rounds(servers: dict[str, Server], specs: dict[str, dict], clients: int, rounds: int,
            seconds: float) -> dict[str, tuple[float, float, float]]:
    got: dict[str, list[tuple[float, float, float]]] = {k: [] for k in servers}
    for r in range(rounds):
        for key in (list(servers) if r % 2 == 0 else list(servers)[::-1]):
            c0 = process_seconds(servers[key].pid)
            out = loadgen.run_closed({**specs[key], "warmup": 0.5, "seconds": seconds}, clients)
            done = out["cycles"] * (seconds + 0.5) / seconds
            lat = sorted(out["lat_ms"]) or [0.0]
            got[key].append((out["cycles"] / seconds,
                             (process_seconds(servers[key].pid) - c0) * 1000 / max(1.0, done),
                             lat[int(len(lat) * 0.99)]))
            if out["errors"]:
                print(f"  {key}: {out['errors']} errors, first: {out['first_error']}")
    return {k: tuple(statistics.median(col) for col in zip(*v, strict=True)) for k, v in got.items()}


def _print(what: str, clients: int, res: dict[str, tuple[float, float, float]]) -> None:
    for key, (rate, cpu, p99) in res.items():
        print(f"{what:6s} {key:8s} {clients:3d} clients: {rate:7.0f} cycles/s, server CPU "
              f"{cpu:.3f} ms/cycle, p99 {p99:.1f} ms")
    u, g = res["uvicorn"], res["granian"]
    print(f"{what:6s} granian/uvicorn {clients:3d} clients: throughput {g[0] / u[0]:.2f}×, "
          f"CPU per cycle {g[1] / u[1]:.2f}×, p99 {g[2] / u[2]:.2f}×", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.granian_cmp", description=__doc__)
    parser.add_argument("--clients", default="8,32")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--only", default="lockd,proxy")
    args = parser.parse_args(argv)
    if not (VENV_BIN / "granian").exists():
        print("granian is not installed (pip install -e '.[granian]')", file=sys.stderr)
        return 2
    clients = [int(c) for c in args.clients.split(",")]
    ws = Workspace()
    try:
        if "lockd" in args.only:
            servers = {"uvicorn": ws.lockd("postgres", "lockd-uvicorn")}
            servers["granian"] = _granian(ws, "lockd-granian", LOCKD_FACTORY, {
                "LOCKD_STORE": sqlalchemy_url(ws.database()),
                "LOCKD_KEY_DIR": str(ws.dir / "keys")})
            specs = {k: {"workload": "lockd", **s.addr(), "prefix": "g"}
                     for k, s in servers.items()}
            for c in clients:
                _print("lockd", c, _rounds(servers, specs, c, args.rounds, args.seconds))
        if "proxy" in args.only:
            pservers, pspecs, _ = _proxy_servers(ws, VENV_BIN.parents[1], ["--workers", "1"], 8)
            dsn = ws.database()
            import psycopg

            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("CREATE TABLE bench_rows (id bigint PRIMARY KEY, v bigint NOT NULL)")
                conn.execute("INSERT INTO bench_rows SELECT g, 0 FROM generate_series(0, 99999) g")
            after = pservers["after"]
            jwks = ws.dir / "proxy-after-jwks.json"
            policy = ws.dir / "proxy-after-policy.yaml"
            granian = _granian(ws, "proxy-granian", "bench.granian_cmp:proxy_app", {
                "PROXY_DATABASE_URL": dsn, "PROXY_JWKS_FILE": str(jwks),
                "PROXY_POLICY": str(policy)})
            servers = {"uvicorn": after, "granian": granian}
            specs = {"uvicorn": pspecs["after"], "granian": {**pspecs["after"], **granian.addr()}}
            _print("proxy", 8, _rounds(servers, specs, 8, args.rounds, args.seconds))
    finally:
        ws.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
