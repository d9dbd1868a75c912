"""``python -m lockd.demo``: the revived-holder demo (``make demo``).

By default it starts lockd and the fencing proxy itself, on free ports, with their SQLite files in
a temporary directory, creates the ``demo_writes`` table, and plays four scenes with real worker
processes (see ``lockd.demo.scenes``). It prints a timeline (seconds since start, worker, event,
fence, HTTP result), the final table, and exits 0 only if every scene ended as it should.

    python -m lockd.demo                                 # everything embedded (SQLite)
    python -m lockd.demo --store URL --database-url URL  # the same, on PostgreSQL
    python -m lockd.demo --lockd-url URL --proxy-url URL # against running services (compose)
    python -m lockd.demo --init-only --database-url URL  # just create the table, then exit
    python -m lockd.demo --tls                           # the same four scenes over mTLS
    python -m lockd.demo --scene 3                       # only scene 3 (the revived holder)

Before scene 1 it says in two lines what a fence is; after the last scene, one takeaway line
names the write the proxy refused, its fence and the fence that beat it. Each holder's first
renewal is printed and the rest counted (``--verbose``: every renewal).

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
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, TextIO

import httpx
from sqlalchemy.exc import SQLAlchemyError

from lockd.common.tls import client_context
from lockd.demo.certs import DemoTLS, make_demo_tls
from lockd.demo.files import SCENES
from lockd.demo.procs import ChildSet
from lockd.demo.scenes import Director, SceneResult
from lockd.demo.services import Endpoints, LocalServices, ServiceStartError, wait_healthy
from lockd.demo.table import COLUMNS, TABLE, create_table
from lockd.demo.timeline import Timeline, format_event, format_header, format_table

__all__ = ["main", "play"]

INTRO = (
    "A fence is a number lockd hands out with every grant of a lock, one higher each time.",
    "The proxy refuses a write whose fence is below the highest it has seen for that lock: "
    "a holder whose lease lapsed cannot overwrite the next holder's work.",
)
"""The two lines printed before scene 1."""

_DESCRIPTION = """\
The revived-holder demo (make demo): four scenes with real worker processes show what a
fencing token protects against. By default it starts lockd and the fencing proxy itself on
free ports, with SQLite files in a temporary directory, and prints a timeline (seconds since
start, worker, fence, HTTP result, event) of each scene, the final table and a one-line
takeaway. Exit status: 0 every scene passed, 1 a scene failed, 2 the services or the table
could not be set up, 130 interrupted.

scenes:
  1  happy path: A renews past its TTL, writes and releases; B, waiting, acquires at once
  2  crash: A is killed (SIGKILL) while holding; B takes over when A's lease lapses
  3  revived holder: A is frozen (SIGSTOP) past its lease, B acquires and writes, A wakes
     (SIGCONT) and its write with the old fence is refused (409 stale_token)
  4  revived holder's file: the same with an output file (a fenced object): A's late file
     write is refused and B's file stands

examples:
  python -m lockd.demo                                 everything embedded (SQLite)
  python -m lockd.demo --scene 3                       only the revived holder
  python -m lockd.demo --store URL --database-url URL  the same, on PostgreSQL
  python -m lockd.demo --lockd-url URL --proxy-url URL against running services
  python -m lockd.demo --init-only --database-url URL  just create the table, then exit
  python -m lockd.demo --tls                           the same scenes over mTLS
"""


class SetupError(RuntimeError):
    """The services or the table are not usable; nothing was played."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m lockd.demo", description=_DESCRIPTION,
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
    p.add_argument("--scene", type=int, action="append", choices=range(1, len(SCENES) + 1),
                   metavar="N", help="play only scene N (1 to 4; repeat for more; "
                                     "default: all, in order)")
    p.add_argument("--verbose", action="store_true",
                   help="print every renewal (default: each holder's first, then a count)")
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
    args.scenes = sorted(set(args.scene or range(1, len(SCENES) + 1)))
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
        _print(out)
        for line in INTRO:
            _print(out, line)
        director = Director(endpoints.lockd_url, endpoints.proxy_url, run=run, ttl=args.ttl,
                            timeline=timeline, children=children, tls=tls)
        results: list[tuple[int, SceneResult]] = []
        for number in args.scenes:
            started = timeline.now()
            result = SCENES[number - 1](director)
            results.append((number, result))
            report["scenes"].append(result.to_json())
            _print_scene(out, number, result, timeline, timeline.now() - started,
                         verbose=args.verbose)
        rows = director.rows()
        report["rows"] = rows
        _print(out, f"\nFinal table {TABLE} (this run's rows, read through the proxy):")
        _print(out, format_table(rows or [], COLUMNS))
        report["ok"] = rows is not None and len(results) == len(args.scenes) and all(
            r.ok for _, r in results)
        verdict = "PASSED" if report["ok"] else "FAILED"
        _print(out, f"\n{verdict}: " + ", ".join(
            f"scene {i} {'ok' if r.ok else 'FAILED'}" for i, r in results)
            + f" in {timeline.now():.1f}s")
        line = takeaway([r for _, r in results])
        if line:
            report["takeaway"] = line
            _print(out, line)
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


def takeaway(results: list[SceneResult]) -> str | None:
    """The last line: the write the proxy refused, its fence and the fence that beat it (from
    the revived-holder scene's facts); ``None`` when that scene did not run or saw no refusal."""
    for result in results:
        stale = result.facts.get("stale") if result.scene == "revived" else None
        if stale and stale.get("code") == "stale_token":
            return (f"Takeaway: A woke up and sent write step {stale.get('step')} with fence "
                    f"{stale.get('presented')}, but B had already written with fence "
                    f"{stale.get('highest')}; the proxy refused it (409 stale_token), so the "
                    "lapsed holder's late write left no trace.")
    return None


def _print_scene(out: TextIO, number: int, result: SceneResult, timeline: Timeline,
                 took: float, *, verbose: bool = False) -> None:
    _print(out, f"\nScene {number}. {result.title}")
    _print(out, format_header())
    renewals: dict[str, int] = {}
    for event in timeline.events(result.scene):
        if event.event == "started":
            continue
        if event.event == "renewed" and not verbose:
            renewals[event.worker] = renewals.get(event.worker, 0) + 1
            if renewals[event.worker] > 1:
                continue
            event = replace(event, detail=f"{event.detail or 'renewed'}; later renewals "
                                          "counted below")
        _print(out, format_event(event))
    if renewals:
        _print(out, "  (renewals: " + ", ".join(
            f"{worker} {count}" for worker, count in renewals.items())
            + "; --verbose prints each)")
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
