"""``python -m lockd.demo``: the revived-holder demo (``make demo``).

By default it starts lockd and the fencing proxy itself, on free ports, with their SQLite files in
a temporary directory, creates the ``demo_writes`` table, and plays three scenes with real worker
processes (see ``lockd.demo.scenes``). It prints a timeline (seconds since start, worker, event,
fence, HTTP result), the final table, and exits 0 only if every scene ended as it should.

    python -m lockd.demo                                 # everything embedded (SQLite)
    python -m lockd.demo --store URL --database-url URL  # the same, on PostgreSQL
    python -m lockd.demo --lockd-url URL --proxy-url URL # against running services (compose)
    python -m lockd.demo --init-only --database-url URL  # just create the table, then exit
    python -m lockd.demo --tls                           # the same three scenes over mTLS

``--tls`` makes a throwaway CA, a server and a client certificate in the temporary directory
(``lockd.demo.certs``); lockd and the proxy then serve https only and require client
certificates, the proxy fetches lockd's keys over mTLS, and every worker, like the demo itself,
presents the client certificate. Not with ``--lockd-url``/``--proxy-url``.

With ``--lockd-url``/``--proxy-url`` it starts no server: the table must already exist when the
proxy starts (the proxy reflects its tables at start-up); ``--database-url`` makes the demo create
it first if missing, which helps only if the proxy starts after that.

Exit status: 0 all scenes passed; 1 a scene failed; 2 the services or the table could not be set
up; 130 interrupted. Whatever happens, every child process is stopped and reaped and the temporary
directory removed (a SIGKILLed demo's children die with it: ``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

import httpx
from sqlalchemy.exc import SQLAlchemyError

from lockd.common.tls import client_context
from lockd.demo.certs import DemoTLS, make_demo_tls
from lockd.demo.procs import ChildSet
from lockd.demo.scenes import SCENES, Director, SceneResult
from lockd.demo.services import Endpoints, LocalServices, ServiceStartError, wait_healthy
from lockd.demo.table import COLUMNS, TABLE, create_table
from lockd.demo.timeline import Timeline, format_event, format_header, format_table

__all__ = ["main", "play"]


class SetupError(RuntimeError):
    """The services or the table are not usable; nothing was played."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m lockd.demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lockd-url", help="use this running lockd (with --proxy-url)")
    p.add_argument("--proxy-url", help="use this running resource-proxy (with --lockd-url)")
    p.add_argument("--store", help="lockd store URL when the demo starts lockd "
                                   "(default: sqlite file in the temporary directory)")
    p.add_argument("--database-url", help="the protected database (SQLAlchemy URL): where the "
                                          "demo creates its table; when the demo starts the "
                                          "proxy, the proxy's database (default: sqlite file)")
    p.add_argument("--init-only", action="store_true",
                   help="create the demo table in --database-url and exit")
    p.add_argument("--tls", action="store_true",
                   help="run lockd, the proxy and every worker over mTLS with certificates "
                        "made for this run")
    p.add_argument("--ttl", type=float, default=1.0,
                   help="lease TTL of every worker, seconds (default 1.0; 0.3 .. 10)")
    p.add_argument("--json-report", metavar="FILE",
                   help="also write the outcome as JSON: scenes, checks, facts, events, rows")
    args = p.parse_args(argv)
    if (args.lockd_url is None) != (args.proxy_url is None):
        p.error("give both --lockd-url and --proxy-url, or neither")
    if args.lockd_url and args.store:
        p.error("--store is for a lockd the demo starts; it cannot be used with --lockd-url")
    if args.tls and args.lockd_url:
        p.error("--tls is for the services the demo starts; it cannot be used with --lockd-url")
    if args.init_only and not args.database_url:
        p.error("--init-only needs --database-url")
    if not 0.3 <= args.ttl <= 10:
        p.error("--ttl must be between 0.3 and 10 seconds")
    return args


def _print(out: TextIO, text: str = "") -> None:
    out.write(text + "\n")
    out.flush()


def _setup(args: argparse.Namespace, children: ChildSet, workdir: Path | None,
           tls: DemoTLS | None = None) -> Endpoints:
    try:
        if args.lockd_url:
            if args.database_url:
                create_table(args.database_url)
            for url in (args.lockd_url, args.proxy_url):
                wait_healthy(url.rstrip("/") + "/healthz", timeout=30)
            endpoints = Endpoints(args.lockd_url.rstrip("/"), args.proxy_url.rstrip("/"),
                                  f"lockd {args.lockd_url}, resource-proxy {args.proxy_url} "
                                  "(running services)")
        else:
            assert workdir is not None
            endpoints = LocalServices(workdir, children, store_url=args.store,
                                      database_url=args.database_url, tls=tls).start()
        verify = client_context(tls.ca, tls.client) if tls else True
        r = httpx.get(f"{endpoints.proxy_url}/v1/tables/{TABLE}/rows", params={"limit": 1},
                      timeout=5, verify=verify)
    except (ServiceStartError, SQLAlchemyError, httpx.HTTPError, FileNotFoundError) as exc:
        raise SetupError(str(exc)) from exc
    if r.status_code != 200:
        raise SetupError(f"the proxy does not serve table {TABLE!r} ({r.status_code} {r.text}); "
                         "create it (python -m lockd.demo --init-only --database-url URL) "
                         "before the proxy starts")
    return endpoints


def play(args: argparse.Namespace, report: dict[str, Any], out: TextIO = sys.stdout) -> bool:
    """Set up, play every scene, print as it goes; fill ``report`` (also when interrupted or
    failing half-way) and return whether every scene passed. Raises ``SetupError``."""
    timeline = Timeline()
    children = ChildSet()
    run = uuid.uuid4().hex[:8]
    report.update(ok=False, run=run, ttl=args.ttl, scenes=[], events=[], rows=None, error=None)
    workdir = None if args.lockd_url else Path(tempfile.mkdtemp(prefix="lockd-demo-"))
    director: Director | None = None
    try:
        tls = make_demo_tls(workdir / "tls") if args.tls and workdir is not None else None
        endpoints = _setup(args, children, workdir, tls)
        report.update(lockd_url=endpoints.lockd_url, proxy_url=endpoints.proxy_url,
                      mode="external" if args.lockd_url else "embedded", tls=tls is not None)
        _print(out, f"lockd demo, run {run}: {endpoints.description}")
        _print(out, f"every worker is its own process; lease TTL {args.ttl:g}s, "
                    f"renewed every {args.ttl / 3:.2f}s; table {TABLE}")
        director = Director(endpoints.lockd_url, endpoints.proxy_url, run=run, ttl=args.ttl,
                            timeline=timeline, children=children, tls=tls)
        results: list[SceneResult] = []
        for number, scene in enumerate(SCENES, 1):
            started = timeline.now()
            result = scene(director)
            results.append(result)
            report["scenes"].append(result.to_json())
            _print_scene(out, number, result, timeline, timeline.now() - started)
        rows = director.rows()
        report["rows"] = rows
        _print(out, f"\nFinal table {TABLE} (this run's rows, read through the proxy):")
        _print(out, format_table(rows or [], COLUMNS))
        report["ok"] = rows is not None and len(results) == len(SCENES) and all(
            r.ok for r in results)
        verdict = "PASSED" if report["ok"] else "FAILED"
        _print(out, f"\n{verdict}: " + ", ".join(
            f"scene {i} {'ok' if r.ok else 'FAILED'}" for i, r in enumerate(results, 1))
            + f" in {timeline.now():.1f}s")
        return report["ok"]
    except SetupError as exc:
        report["error"] = str(exc)
        raise
    finally:
        report["events"] = [asdict(e) for e in timeline.events()]
        report["elapsed_s"] = round(timeline.now(), 3)
        # A second Ctrl-C (or a SIGTERM) must not cut the clean-up short.
        previous = {sig: signal.signal(sig, signal.SIG_IGN)
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            if director is not None:
                director.close()
            children.stop_all()
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _print_scene(out: TextIO, number: int, result: SceneResult, timeline: Timeline,
                 took: float) -> None:
    _print(out, f"\nScene {number}. {result.title}")
    _print(out, format_header())
    for event in timeline.events(result.scene):
        if event.event != "started":
            _print(out, format_event(event))
    for check in result.checks:
        mark = "ok  " if check.ok else "FAIL"
        _print(out, f"  {mark} {check.name}" + (f": {check.detail}" if check.detail else ""))
    for line in result.facts.get("diagnostics", []):
        _print(out, f"       {line}")
    _print(out, f"  => scene {number} {'passed' if result.ok else 'FAILED'} ({took:.1f}s)")


def _write_report(path: str | None, report: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(report, indent=2, default=str) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.init_only:
        try:
            create_table(args.database_url)
        except SQLAlchemyError as exc:
            print(f"lockd demo: cannot create {TABLE}: {exc}", file=sys.stderr)
            return 2
        print(f"lockd demo: table {TABLE} ready")
        return 0

    def terminate(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    report: dict[str, Any] = {"ok": False}
    started = time.monotonic()
    try:
        return 0 if play(args, report) else 1
    except SetupError as exc:
        print(f"lockd demo: setup failed: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        report["error"] = "interrupted"
        print(f"\nlockd demo: interrupted after {time.monotonic() - started:.1f}s; "
              "everything stopped and cleaned up", file=sys.stderr)
        return 130
    finally:
        _write_report(args.json_report, report)


if __name__ == "__main__":
    sys.exit(main())
