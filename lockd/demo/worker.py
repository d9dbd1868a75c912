"""One demo worker: a real process that takes a lock, works, writes through the fencing proxy.

Run by the director as ``python -m lockd.demo.worker --name A --lock demo_writes …``. It uses the
public client API exactly as an application would::

    with client.acquire(lock, ttl, wait=wait) as lease:        # background renewal every ttl/3
        session = FencedSession(proxy_url, lease)              # claims the fence on first use
        session.insert("demo_writes", row)                     # Fencing-Token: lease.token

and reports what happens as JSON lines on stdout (``timeline.Event``), stamped against the
director's clock origin (``--t0``, a ``time.monotonic()`` value: system-wide on Linux).

"Work" is a loop of 10 ms sleeps, so it advances only while the process runs: a worker frozen with
SIGSTOP resumes where it stopped, still believing it holds the lock, and sends its next write with
its old token. That is the point of scene 3: the worker never checks ``lease.lost`` before writing
(the check could pass just before a freeze anyway); the proxy's fence check is what stops it.

Exit status: 0 when the worker ran its script (a rejected stale write included; the events say
what happened), 3 when it could not acquire within ``--wait``, 1 on any other error.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from typing import Any

from lockd.client import Lease, LockClient
from lockd.client.errors import (
    LeaseLostError,
    LockClientError,
    LockNotAcquired,
    StaleTokenError,
)
from lockd.client.fenced import FencedSession
from lockd.demo.procs import die_with_parent
from lockd.demo.table import TABLE, row
from lockd.demo.timeline import Event, write_event

__all__ = ["main", "work"]

WORK_UNIT = 0.01
"""Seconds of one unit of simulated work (a sleep); frozen time does not count."""


def work(seconds: float) -> None:
    """Simulate ``seconds`` of work that only progresses while this process runs."""
    for _ in range(round(seconds / WORK_UNIT)):
        time.sleep(WORK_UNIT)


class _Reporter:
    """Writes this worker's events to stdout (thread-safe: the renewal watcher reports too)."""

    def __init__(self, name: str, scene: str, origin: float):
        self.name, self.scene, self.origin = name, scene, origin
        self._mutex = threading.Lock()

    def now(self) -> float:
        return time.monotonic() - self.origin

    def __call__(self, event: str, *, fence: int | None = None, http: str | None = None,
                 detail: str = "", t: float | None = None, **data: Any) -> None:
        e = Event(round(self.now() if t is None else t, 3), self.name, event, fence, http,
                  detail, self.scene, data)
        with self._mutex:
            write_event(sys.stdout, e)


class _RenewalWatcher(threading.Thread):
    """Reports each successful background renewal (the lease's local deadline moving on)."""

    def __init__(self, lease: Lease, report: _Reporter):
        super().__init__(name="demo-renewal-watcher", daemon=True)
        self.lease, self.report = lease, report
        self.halted = threading.Event()

    def run(self) -> None:
        seen = self.lease.deadline
        while not self.halted.wait(0.01):
            deadline = self.lease.deadline
            if deadline > seen and not self.lease.lost.is_set():
                seen = deadline
                self.report("renewed", fence=self.lease.fence, http="200",
                            detail=f"renewed (ttl {self.lease.ttl:g}s)")

    def halt(self) -> None:
        self.halted.set()
        self.join()


_LOST_BECAUSE = {
    "lease_lost": "lockd answered 410 lease_lost",
    "local_deadline": "local deadline passed without a renewal",
    "stale_token": "the proxy has seen a higher fence",
}


def _http(exc: LockClientError | None) -> str | None:
    """``"409 stale_token"``; ``None`` when the error is not an HTTP answer (a local deadline)."""
    if exc is None or exc.status is None:
        return None
    return f"{exc.status} {exc.code}"


def run(args: argparse.Namespace) -> int:
    report = _Reporter(args.name, args.scene, args.t0)
    report("started", detail=f"started (pid {os.getpid()})", pid=os.getpid())
    tls: dict[str, Any] = {}
    if args.ca:
        tls = {"verify": args.ca, "cert": (args.cert, args.key) if args.cert else None}
    client = LockClient(args.lockd_url, owner=args.name, **tls)
    lease: Lease | None = None
    released_at = None

    def lost(lease: Lease) -> None:
        reason = lease.lost_reason
        code = reason.code if reason is not None else ""
        how = _LOST_BECAUSE.get(code, code)
        report("lease_lost", fence=lease.fence, http=_http(reason),
               detail=f"lease lost: {how}", code=code)

    try:
        report("acquiring", detail=f"acquire {args.lock} (ttl {args.ttl:g}s, wait {args.wait:g}s)")
        with client.acquire(args.lock, args.ttl, wait=args.wait, on_lost=lost) as lease:
            report("acquired", fence=lease.fence, http="200", detail=f"acquired {args.lock}")
            watcher = _RenewalWatcher(lease, report)
            watcher.start()
            # refuse_lost=False: the demo shows the proxy's fence refusing a lapsed writer,
            # not the client refusing first because it already knows its lease is lost
            session = FencedSession(args.proxy_url, lease, refuse_lost=False, **tls)
            try:
                for step in range(1, args.writes + 1):
                    if step > 1:
                        work(args.work)
                    record = row(args.run, args.scene, args.name, lease.fence, step)
                    try:
                        if args.object:  # the job's output file, a fenced object
                            with session.output(args.lock, args.object,
                                                content_type="text/plain") as out:
                                out.write(f"{args.name} fence {lease.fence} step {step}\n"
                                          .encode())
                            written = out.result or {}
                            status = "201" if written.get("version") == 1 else "200"
                        else:
                            session.insert(TABLE, record)
                            status = "201"
                    except StaleTokenError as exc:
                        report("write_rejected", fence=lease.fence, http=_http(exc),
                               detail=f"write step {step} REJECTED: stale fence "
                                      f"{exc.presented} < highest {exc.highest}",
                               step=step, presented=exc.presented, highest=exc.highest,
                               status=exc.status, code=exc.code)
                        break
                    what = (f"file {args.lock}/{args.object}" if args.object
                            else f"{TABLE} {record['id']}")
                    report("write", fence=lease.fence, http=status,
                           detail=f"write step {step} ({what})", step=step)
                else:
                    work(args.hold)
            finally:
                watcher.halt()
                session.close()
            released_at = report.now()
        report("released", fence=lease.fence, http="200", detail=f"released {args.lock}",
               t=released_at)
        return 0
    except LockNotAcquired as exc:
        report("not_acquired", http=_http(exc) or "409 held", detail=f"not acquired: {exc.detail}")
        return 3
    except LeaseLostError as exc:
        report("release_refused", fence=lease.fence if lease else None, http=_http(exc),
               detail=f"release refused: lease already lost "
                      f"({_LOST_BECAUSE.get(exc.code, exc.code)})",
               t=released_at,
               code=exc.code)
        return 0
    except LockClientError as exc:
        report("error", fence=lease.fence if lease else None, http=_http(exc) or exc.code,
               detail=f"{type(exc).__name__}: {exc.detail}")
        return 1
    finally:
        client.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m lockd.demo.worker", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lockd-url", required=True)
    p.add_argument("--proxy-url", required=True)
    p.add_argument("--name", required=True, help="the worker's label (lease owner, row worker)")
    p.add_argument("--scene", required=True)
    p.add_argument("--lock", required=True)
    p.add_argument("--run", required=True, help="the demo run's id (part of each row's key)")
    p.add_argument("--t0", type=float, required=True, help="time.monotonic() of t = 0")
    p.add_argument("--ttl", type=float, default=1.0, help="lease TTL in seconds")
    p.add_argument("--wait", type=float, default=0.0, help="seconds to wait for the lock")
    p.add_argument("--writes", type=int, default=1, help="writes to make while holding")
    p.add_argument("--work", type=float, default=0.0, help="seconds of work between writes")
    p.add_argument("--hold", type=float, default=0.0, help="seconds of work after the last write")
    p.add_argument("--object", default=None, metavar="KEY",
                   help="write output file KEY of bucket --lock (a fenced object), not rows")
    p.add_argument("--ca", help="CA file of the servers' certificate (https URLs)")
    p.add_argument("--cert", help="client certificate presented to both servers (mTLS)")
    p.add_argument("--key", help="its private key")
    p.add_argument("--parent-pid", type=int, default=None,
                   help="exit at once if this is no longer the parent (started by the director)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    die_with_parent(args.parent_pid)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
