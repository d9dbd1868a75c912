"""The HTTP stack's own cost per request on this machine (not a test; prints figures).

Starts two do-nothing servers on the same uvicorn (uvloop, httptools, access log off, one
process): a raw ASGI callable answering ``{}`` (any request body received and dropped: also
section 10's ceiling of receiving an object), and a FastAPI app whose route answers ``{}``
(``bench.peers``' ``fastapi`` noop), then alternates closed-loop rounds of ``GET /noop`` between
them (ABBA, ``bench.loadgen``'s ``noop`` workload) and prints each one's median requests/s and
CPU per request (read from ``/proc``). The raw-ASGI figure is the floor of any proxy request
on this HTTP server; the difference between the two is the most that a raw-ASGI fast path
past FastAPI/Starlette could save::

    python -m bench.http_ceiling [--clients 8] [--seconds 2] [--rounds 6]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from bench import loadgen
from bench.cpu import process_seconds
from bench.peers import PYTHON, Server, Workspace
from harness import ServiceProcess, free_port

__all__ = ["main", "raw_asgi"]

_RAW_ASGI = """
import sys, uvicorn
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):  # the request's body, received and dropped
        pass
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b"{}"})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning",
            access_log=False, server_header=False)
"""


def raw_asgi(ws: Workspace) -> Server:
    port = free_port()
    proc = ServiceProcess([PYTHON, "-c", _RAW_ASGI, str(port)],
                          ready_url=f"http://127.0.0.1:{port}/healthz",
                          cwd=Path(__file__).resolve().parents[1],
                          log_path=ws.dir / "noop-asgi.log").start(timeout=30)
    server = Server("noop-asgi", "127.0.0.1", port, proc)
    ws.servers.append(server)
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.http_ceiling", description=__doc__)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args(argv)
    ws = Workspace()
    try:
        servers = {"raw ASGI": raw_asgi(ws), "FastAPI": ws.noop("fastapi")}
        rates: dict[str, list[float]] = {k: [] for k in servers}
        cpu: dict[str, list[float]] = {k: [] for k in servers}
        keys = list(servers)
        for r in range(args.rounds):
            for key in keys if r % 2 == 0 else keys[::-1]:
                server = servers[key]
                c0 = process_seconds(server.pid)
                out = loadgen.run_closed({"workload": "noop", **server.addr(), "warmup": 0.5,
                                          "seconds": args.seconds}, args.clients)
                done = out["cycles"] * (args.seconds + 0.5) / args.seconds  # warm-up too
                rates[key].append(out["cycles"] / args.seconds)
                cpu[key].append((process_seconds(server.pid) - c0) * 1000 / max(1.0, done))
        for key in servers:
            print(f"{key:9s} {statistics.median(rates[key]):7.0f} requests/s (rounds "
                  f"{', '.join(f'{x:.0f}' for x in rates[key])}); server CPU "
                  f"{statistics.median(cpu[key]):.3f} ms/request")
    finally:
        ws.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
