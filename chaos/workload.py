"""One chaos worker: a real process looping read-modify-write under lock L, logging what it sees.

``python -m chaos.workload --worker w1 --incarnation 0 --lockd URL --proxy URL --db URL
--log FILE [--mode fenced|unfenced-read|nofence] [--workload counter] …``. Each iteration (an
*operation*, id ``<worker>.<incarnation>.<n>``) of the ``counter`` workload (``WORKLOADS``; a
second workload plugs in as another ``Worker._op_<name>`` method and a ``--workload`` choice)::

    attempt -> acquire L (no auto-renewal: the worker's own renewal  -> acquired {fence}
               thread logs each success as renewed {sent})
            -> rmw (most ops): read the counter (fenced: claim first,   -> read {value}
               by a fenced read, or by POST .../claim then a plain GET
               without the token: the claim alone must raise the highest)
               think a random while (the nemesis likes to freeze us here)
               write counter = value + 1, naming the op, by one of    -> write {via} (sent)
               batch (+ a mark row) / PATCH / PUT
            -> or blind (no claim, no read): POST / PUT / batch a mark
               row, or DELETE this worker's last mark                  -> write {via, mark}
            -> ack | stale {presented, highest} | unknown | rejected
            -> release {up = when sent} L
    (some iterations are a peek instead: a plain read without any lock or token)

The ``transfer`` workload (``chaos.transferwork``): acquire_many of two random account locks,
then a fenced read of both balances and ONE batch writing both, or a blind multi-lock batch.

The ``rw``, ``sem`` and ``election`` workloads (``chaos.rwwork``, ``chaos.electwork``: ``ext``
acquires, renews, releases and runs their operations): readers on shared locks beside the
counter's writers; permits of a semaphore writing their slots; leaders writing a term log.

In every workload, ``--near`` of the operations (fenced and noclaim modes) are near operations
(``chaos.near``): a neighbour lock whose name contains or is contained by the workload's own
(``chaos/counter/1``, ``accounts/10``, ``accounts/1/x``, ...), one row written blind under it.

The ``sql`` workload (``_op_sql``, ``chaos.sqlwork``): the same two-account leases, plain SQL
inside ``fenced_transaction`` on the protected database (no proxy): transfers read-modify-write
or blind, orders and lines inserted, updated set-wise, deleted by cascade. ``--mode noclaim``
is its control: the same SQL without the claims, every write refused by the triggers.

Every write is logged by the database itself (``chaos.db``: triggers into ``history``), so a
committed write is known whatever the worker heard. The read and write go, by ``--mode``:

- ``fenced`` (the real thing): ``FencedSession.get`` (claims the fence, then a fenced read) and
  ``FencedSession.batch``/``update``/``upsert``; blind mark writes go as plain HTTP with the
  token and no claim (so a write path that forgets to raise the highest is not hidden by one).
- ``unfenced-read`` (control): a plain GET without the token (no claim), then the batch with
  the token: the lost-update window of invariant 7 stays open.
- ``nofence`` (control): the lock alone; read and write straight to the database.
- ``noclaim`` (control of the ``sql`` workload): plain SQL transactions without the claims;
  the database's fence triggers must refuse every write.

The worker never looks at ``lease.lost`` before writing: a frozen holder that wakes up sends its
write regardless, as a real one could after the check passed. Stopping the write is the fence's
job, and the checker judges whether it did.

Log lines are JSON (one ``os.write`` each, appended), stamped with ``t`` (this process's wall
clock, which faketime may skew) and ``up`` (the machine's real uptime from ``/proc/uptime``,
which libfaketime does not fake: the only timestamps comparable across workers).

SIGTERM: finish the current operation, log ``stop``, exit 0.

libfaketime 0.9.10 quirk worked around here: with ``FAKETIME_DONT_FAKE_MONOTONIC=1`` its
``clock_nanosleep`` wrapper makes Python's ``time.sleep`` fail with EINVAL, so under that setting
``time.sleep`` is replaced by a ``select``-based sleep (the client library sleeps between acquire
retries). With monotonic faked, threading timed waits never time out (the faked monotonic clock
reads like the wall clock, ~1.8e9 s), so the client's renewal thread sleeps until the release
wakes it: such a worker never renews, a clock-broken client the fence must cope with.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import signal
import sqlite3
import sys
import threading
import time
from typing import Any

import httpx
import psycopg

from chaos.db import account_ids
from lockd.client import Lease, LeaseRef, LockClient
from lockd.client.errors import (
    AcquireTimeout,
    LeaseLostError,
    LockClientError,
    ServiceUnavailable,
    StaleTokenError,
    error_from_response,
    translate_transport_errors,
)
from lockd.client.fenced import FencedSession

__all__ = ["MODES", "WORKLOADS", "main", "uptime"]

MODES = ("fenced", "unfenced-read", "nofence", "noclaim")
"""``noclaim``: the ``sql`` workload's control, plain SQL with no claim (see ``chaos.sqlwork``)."""
WORKLOADS = ("counter", "transfer", "sql", "rw", "sem", "election")
RMW_VIAS = ("batch", "batch", "patch", "put")
MARK_VIAS = ("post", "batch", "batch", "put", "delete", "delete")
BLIND_PHASE_VIAS = ("batch", "batch", "post", "put", "delete")
"""The blind phase's writes: every write path, none after a claim of its own (a frozen holder
thawed after its successor's blind batch then sends a single-row write as often as a batch)."""
BLIND_PHASE_S = 4.0
"""Length of the phases (s) of the counter workload, in turn: blind (85 % blind writes, by
``BLIND_PHASE_VIAS``), claim (every operation a read-modify-write that claims, then reads
plainly), mixed (``Worker._op_counter``)."""
_DIRECT_ERRORS = (psycopg.Error, sqlite3.Error, OSError)


def uptime() -> float:
    """The machine's real uptime in seconds (10 ms resolution), untouched by libfaketime."""
    with open("/proc/uptime", "rb") as fh:
        return float(fh.read().split()[0])


def _sleep(seconds: float) -> None:
    """Sleep until ``seconds`` from now have passed on the monotonic clock, in ``select`` steps
    of at most 10 ms (``select`` works under every faketime setting). Frozen time counts: a
    worker SIGSTOPped mid-think resumes and writes at once, like a process paused by GC while
    it waited, instead of sleeping the rest of its think (a restarted ``select`` would)."""
    deadline = time.monotonic() + seconds
    while seconds > 0:
        select.select([], [], [], min(seconds, 0.01))
        seconds = deadline - time.monotonic()


def _fix_faketime_sleep() -> None:
    if "faketime" in os.environ.get("LD_PRELOAD", "") and \
            os.environ.get("FAKETIME_DONT_FAKE_MONOTONIC") == "1":
        time.sleep = _sleep
        # the client binds time.sleep as a default argument at import: rebind it there too
        LockClient._run.__defaults__ = (_sleep,)


class EventLog:
    """Appends one JSON line per event to ``path``."""

    def __init__(self, path: str, worker: str, incarnation: int):
        self.worker, self.incarnation = worker, incarnation
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def __call__(self, ev: str, **fields: Any) -> None:
        record = {"ev": ev, "w": self.worker, "i": self.incarnation,
                  "t": round(time.time(), 3), "up": uptime(), **fields}
        os.write(self.fd, (json.dumps(record) + "\n").encode())

    def close(self) -> None:
        os.close(self.fd)


def _error_fields(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, LockClientError):
        return {"status": exc.status, "code": exc.code, "error": exc.detail[:200]}
    return {"status": None, "code": type(exc).__name__, "error": str(exc)[:200]}


class Worker:
    """The loop of one worker process (see the module docstring)."""

    def __init__(self, args: argparse.Namespace, log: EventLog):
        self.a = args
        self.log = log
        self.rng = random.Random(f"{args.seed}:{args.worker}:{args.incarnation}")
        self.http = httpx.Client(timeout=args.timeout)
        # connect_timeout=None: the workers ride out the nemesis' lockd stops, as they did
        # before clients failed fast on an unreachable lockd
        self.client = LockClient(args.lockd, timeout=args.timeout, connect_timeout=None,
                                 owner=f"{args.worker}.{args.incarnation}")
        self.direct = None
        if args.mode == "nofence":
            from chaos.db import Direct

            self.direct = Direct(args.db)
        self.transfers: Any = None
        if args.workload == "transfer":
            from chaos.transferwork import TransferOps

            self.transfers = TransferOps(self, _sleep)
        self.sql = None
        if args.workload == "sql":
            from chaos.sqlwork import SqlOps

            self.sql = SqlOps(self, args.db, _sleep)
        self.ext: Any = None
        """The ``rw``/``sem``/``election`` operations (``chaos.rwwork``, ``chaos.electwork``)."""
        if args.workload == "rw":
            from chaos.rwwork import RwOps

            self.ext = RwOps(self, _sleep)
        elif args.workload == "sem":
            from chaos.rwwork import SemOps

            self.ext = SemOps(self, _sleep, args.lock)
        elif args.workload == "election":
            from chaos.electwork import ElectionOps

            self.ext = ElectionOps(self, _sleep, args.lock)
        self.near: Any = None
        """Near operations on neighbour locks (``chaos.near``), in ``fenced``/``noclaim``."""
        if args.mode in ("fenced", "noclaim") and args.near > 0:
            from chaos.near import NearOps

            self.near = NearOps(self, _sleep, args.workload, self.sql)
        self.stopping = False
        self._last_mark: str | None = None
        """The last mark this worker saw committed (the target of its next DELETE)."""

    # -- the three ways to read and write -------------------------------------------------

    def _read(self, lease: Lease, session: FencedSession, claim_first: bool = False) -> int:
        """The counter's value. ``fenced``: a fenced read (claim + read with the token), or
        with ``claim_first`` the documented pattern "claim, then plain reads": ``POST
        /v1/fences/{lock}/claim``, then a GET without the token (which raises nothing)."""
        if self.a.mode == "fenced" and claim_first:
            session.claim()
            return int(self._plain("GET", "/v1/tables/counter/rows/1", None)["value"])
        if self.a.mode == "fenced":
            return int(session.get("counter", 1)["value"])
        if self.a.mode == "unfenced-read":
            path = "/v1/tables/counter/rows/1"
            with translate_transport_errors(f"GET {path}"):
                response = self.http.get(self.a.proxy + path)
            if response.status_code != 200:
                raise error_from_response(response)
            return int(response.json()["value"])
        assert self.direct is not None
        return self.direct.read()

    def _write(self, op: str, lease: Lease, session: FencedSession, read: int, wrote: int,
               via: str = "batch") -> None:
        row = {"value": wrote, "op": op, "worker": self.a.worker, "fence": lease.fence,
               "read_value": read}
        if self.a.mode == "nofence":
            assert self.direct is not None
            self.direct.write(op, self.a.worker, lease.fence, read, wrote)
            return
        ops = [{"op": "update", "table": "counter", "key": 1, "row": row},
               {"op": "insert", "table": "marks",
                "row": {"id": op, "worker": self.a.worker, "fence": lease.fence}}]
        if self.a.mode == "fenced":
            if via == "patch":
                session.update("counter", 1, row)
            elif via == "put":
                session.upsert("counter", 1, {"id": 1, **row})
            else:
                session.batch(ops)
            return
        # unfenced-read: the batch carries the token, but nothing was claimed before the read.
        self._plain("POST", "/v1/batch", lease, {"ops": ops})

    def _plain(self, method: str, path: str, lease: Lease | None, body: Any = None) -> Any:
        """One request with the lease's token (if any) and no claim, no retry."""
        headers = {"Fencing-Token": lease.token} if lease is not None else {}
        with translate_transport_errors(f"{method} {path}"):
            response = self.http.request(method, self.a.proxy + path, json=body, headers=headers)
        if response.status_code >= 300:
            raise error_from_response(response)
        return response.json() if response.content else None

    # -- one operation --------------------------------------------------------------------

    def _outcome(self, op: str, phase: str, exc: BaseException, fence: int) -> None:
        if isinstance(exc, StaleTokenError):
            self.log("stale", op=op, phase=phase, fence=fence, presented=exc.presented,
                     highest=exc.highest, status=exc.status)
        elif isinstance(exc, ServiceUnavailable) or isinstance(exc, _DIRECT_ERRORS) or (
                isinstance(exc, LockClientError) and not (exc.status and 400 <= exc.status < 500)):
            self.log("unknown", op=op, phase=phase, fence=fence, **_error_fields(exc))
        else:
            self.log("rejected", op=op, phase=phase, fence=fence, **_error_fields(exc))

    @staticmethod
    def phase() -> int:
        """The phase now: 0 blind, 1 claim, 2 mixed, ``BLIND_PHASE_S`` each in turn, by the
        machine's uptime (every worker is in the same one)."""
        return int(uptime() / BLIND_PHASE_S) % 3

    def _op_counter(self, op: str, lease: Lease) -> None:
        """The ``counter`` workload: a read-modify-write of the counter, or a blind mark write.
        Every ``BLIND_PHASE_S`` x 3 seconds of real time, all workers spend ``BLIND_PHASE_S`` in a
        blind phase (85 % blind writes, batches and single rows): a frozen holder's successor
        then often writes a blind batch, the one write that alone must raise the highest past
        the frozen fence, and the frozen holder's own write is as often a single-row write
        whose own check alone must refuse it (no claim of its own came first)."""
        phase = self.phase()
        blind_phase, claim_phase = phase == 0, phase == 1
        share = 0.85 if blind_phase else 0.0 if claim_phase else self.a.blind
        if self.a.mode == "fenced" and self.rng.random() < share:
            self._blind(op, lease, BLIND_PHASE_VIAS if blind_phase else MARK_VIAS)
        else:
            self._rmw(op, lease, claim_first=True if claim_phase else None)

    def _rmw(self, op: str, lease: Lease, claim_first: bool | None = None) -> None:
        """A read-modify-write; ``claim_first``: "claim, then plain reads" (None: by
        ``--claim-then-read``). In the claim phases every operation is one, so a frozen
        holder's immediate successor has often only claimed when it is killed after its read:
        the claim alone must have raised the highest past the frozen fence."""
        session = FencedSession(self.a.proxy, lease, timeout=self.a.timeout, http_client=self.http,
                                refuse_lost=False)  # the fence alone decides: what chaos tests
        _sleep(self.rng.uniform(0.02, 0.06))  # setting up after the grant, before the claim
        draw = self.rng.random()  # drawn always: the rest of the sequence keeps its seed
        if claim_first is None:
            claim_first = draw < self.a.claim_then_read
        try:
            value = self._read(lease, session, claim_first)
        except (LockClientError, *_DIRECT_ERRORS) as exc:
            self._outcome(op, "read", exc, lease.fence)
            return
        via = self.rng.choice(RMW_VIAS) if self.a.mode == "fenced" else "batch"
        self.log("read", op=op, fence=lease.fence, value=value, fenced=self.a.mode == "fenced",
                 via=via, read_via="claim+plain" if claim_first else "fenced")
        _sleep(self.rng.uniform(self.a.think_min, self.a.think_max))
        wrote = value + 1
        self.log("write", op=op, fence=lease.fence, read=value, wrote=wrote, via=via)
        try:
            self._write(op, lease, session, value, wrote, via)
        except (LockClientError, *_DIRECT_ERRORS) as exc:
            self._outcome(op, "write", exc, lease.fence)
            return
        if via == "batch":
            self._last_mark = op
        self.log("ack", op=op, fence=lease.fence, read=value, wrote=wrote)

    def _blind(self, op: str, lease: Lease, vias: tuple[str, ...] = MARK_VIAS) -> None:
        """A write with no claim and no read before it: POST/PUT/batch a mark, or DELETE the
        last mark this worker saw committed (a POST when there is none)."""
        via = self.rng.choice(vias)
        mark = op
        if via == "delete":
            if self._last_mark is None:
                via = "post"
            else:
                mark = self._last_mark
        self.log("blind", op=op, fence=lease.fence, via=via)  # the nemesis may freeze us here
        _sleep(self.rng.uniform(self.a.think_min, self.a.think_max))
        row = {"id": op, "worker": self.a.worker, "fence": lease.fence}
        self.log("write", op=op, fence=lease.fence, via=via, mark=mark)
        try:
            if via == "post":
                self._plain("POST", "/v1/tables/marks/rows", lease, row)
            elif via == "put":
                self._plain("PUT", f"/v1/tables/marks/rows/{op}", lease, row)
            elif via == "batch":
                self._plain("POST", "/v1/batch", lease,
                            {"ops": [{"op": "insert", "table": "marks", "row": row}]})
            else:
                self._plain("DELETE", f"/v1/tables/marks/rows/{mark}", lease)
        except LockClientError as exc:
            if via == "delete" and exc.status == 404:
                self._last_mark = None
            self._outcome(op, "write", exc, lease.fence)
            return
        self._last_mark = None if via == "delete" else op
        self.log("ack", op=op, fence=lease.fence, via=via, mark=mark)

    def _op_transfer(self, op: str, lease: Lease) -> None:
        """The ``transfer`` workload (``chaos.transferwork``)."""
        self.transfers.run(op, lease)

    def _op_rw(self, op: str, lease: Any) -> None:
        self.ext.run(op, lease)

    _op_sem = _op_election = _op_rw

    def _op_sql(self, op: str, lease: Lease) -> None:
        """The ``sql`` workload: plain SQL on the protected database (``chaos.sqlwork``)."""
        assert self.sql is not None
        self.sql.run(op, lease)

    def _acquire(self) -> Lease:
        """The lease of one operation: lock L, or (``transfer``, ``sql``) two random account
        locks; ``rw``/``sem``/``election``: ``ext``'s lease)."""
        if self.ext is not None:
            return self.ext.acquire()
        if self.a.workload == "counter":
            return self.client.acquire(self.a.lock, self.a.ttl, wait=self.a.acquire_wait,
                                       auto_renew=False)
        pair = self.rng.sample(account_ids(self.a.accounts), 2)
        return self.client.acquire_many([f"accounts/{n}" for n in pair], self.a.ttl,
                                        wait=self.a.acquire_wait, auto_renew=False)

    def _lockd(self, path: str, body: dict[str, Any]) -> Any:
        """A plain POST to lockd (the multi-lock lease endpoints, by lease id)."""
        with translate_transport_errors(f"POST {path}"):
            response = self.http.post(self.a.lockd.rstrip("/") + path, json=body)
        if response.status_code >= 300:
            raise error_from_response(response)
        return response.json() if response.content else None

    def _raw(self) -> Any:
        """The ``chaos.rwwork.LeaseOps`` that renews and releases raw leases."""
        return self.ext if self.ext is not None else self.near

    def _renew_once(self, lease: Lease) -> None:
        if hasattr(lease, "base"):  # a ``chaos.rwwork.RawLease``
            self._raw().renew(lease)
        elif hasattr(lease, "fences"):
            self._lockd("/v1/leases/renew", {"lease_id": lease.lease_id,
                                             "ttl_ms": round(self.a.ttl * 1000)})
        else:
            self.client.renew(LeaseRef(lease.lock, lease.lease_id), ttl=self.a.ttl)

    def _release(self, lease: Lease) -> None:
        if hasattr(lease, "base"):
            self._raw().release(lease)
        elif hasattr(lease, "fences"):
            self._lockd("/v1/leases/release", {"lease_id": lease.lease_id})
        else:
            self.client.release(LeaseRef(lease.lock, lease.lease_id))

    def _peek(self, op: str) -> None:
        """A read with no lock and no token: allowed, never fenced, never raises the highest."""
        try:
            body = self._plain("GET", "/v1/tables/counter/rows/1", None)
        except LockClientError as exc:
            self.log("rejected", op=op, phase="peek", **_error_fields(exc))
            return
        self.log("peek", op=op, value=int(body["value"]))

    def _renew_loop(self, op: str, lease: Lease, stop: threading.Event) -> None:
        """Renew every ttl/3 (own thread), logging ``renewed {sent}`` (uptime when the request
        left) for each success: lockd then set the expiry to at least ``sent + ttl``."""
        while not stop.wait(self.a.ttl / 3):
            sent = uptime()
            try:
                self._renew_once(lease)
            except LeaseLostError:
                self.log("renew_lost", op=op, fence=lease.fence, sent=sent)
                return
            except LockClientError as exc:
                self.log("renew_failed", op=op, fence=lease.fence, sent=sent, **_error_fields(exc))
                continue
            self.log("renewed", op=op, fence=lease.fence, sent=sent)

    def run(self) -> None:
        seq = 0
        while not self.stopping:
            seq += 1
            op = f"{self.a.worker}.{self.a.incarnation}.{seq}"
            self.log("attempt", op=op)
            if self.a.mode == "fenced" and self.a.workload == "counter" \
                    and self.rng.random() < self.a.peek:
                self._peek(op)
                continue
            near = self.near is not None and self.rng.random() < self.a.near
            try:
                lease = self.near.acquire() if near else self._acquire()
            except AcquireTimeout:
                self.log("not_acquired", op=op, phase="acquire", code="timeout")
                continue
            except LockClientError as exc:
                self.log("not_acquired", op=op, phase="acquire", **_error_fields(exc))
                _sleep(0.1)
                continue
            fences = getattr(lease, "fences", None)
            self.log("acquired", op=op, fence=lease.fence,
                     **({"fences": dict(fences)} if fences else {}),
                     **getattr(lease, "log_fields", {}))
            stop = threading.Event()
            renewer = threading.Thread(target=self._renew_loop, args=(op, lease, stop),
                                       daemon=True)
            renewer.start()
            try:
                if near:
                    self.near.run(op, lease)
                else:
                    getattr(self, "_op_" + self.a.workload)(op, lease)
            finally:
                stop.set()
                self.log("release", op=op, fence=lease.fence)
                try:
                    self._release(lease)
                except LockClientError:
                    pass  # lost or lockd unavailable: the TTL frees the lock

    def close(self) -> None:
        self.client.close()
        self.http.close()
        if self.direct is not None:
            self.direct.close()
        if self.sql is not None:
            self.sql.close()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m chaos.workload", description=__doc__.splitlines()[0])
    p.add_argument("--worker", required=True)
    p.add_argument("--incarnation", type=int, default=0)
    p.add_argument("--lockd", required=True, help="lockd base URL")
    p.add_argument("--proxy", required=True, help="fencing proxy base URL")
    p.add_argument("--db", default="", help="protected database URL (nofence mode)")
    p.add_argument("--log", required=True, help="JSON-lines event log (appended)")
    p.add_argument("--mode", choices=MODES, default="fenced")
    p.add_argument("--lock", default="chaos/counter")
    p.add_argument("--ttl", type=float, default=1.0, help="lease TTL, seconds")
    p.add_argument("--think-min", type=float, default=0.05, help="seconds")
    p.add_argument("--think-max", type=float, default=0.4, help="seconds")
    p.add_argument("--acquire-wait", type=float, default=2.0, help="seconds")
    p.add_argument("--timeout", type=float, default=5.0, help="per-request timeout, seconds")
    p.add_argument("--seed", default="0")
    p.add_argument("--workload", choices=WORKLOADS, default="counter")
    p.add_argument("--accounts", type=int, default=8, help="account rows (transfer workload)")
    p.add_argument("--blind", type=float, default=0.35,
                   help="share of operations that write a mark with no claim (fenced mode)")
    p.add_argument("--claim-then-read", type=float, default=0.5,
                   help="share of read-modify-writes that claim explicitly, then read without "
                        "the token (counter workload, fenced mode)")
    p.add_argument("--readers", type=float, default=0.6,
                   help="share of operations that take the lock shared and read (rw workload)")
    p.add_argument("--illicit", type=float, default=0.2,
                   help="share of the readers' operations that try to write (rw workload)")
    p.add_argument("--limit", type=int, default=2, help="permits of the semaphore (sem workload)")
    p.add_argument("--near", type=float, default=0.1,
                   help="share of operations on a neighbour lock (chaos.near; fenced, noclaim)")
    p.add_argument("--peek", type=float, default=0.05,
                   help="share of iterations that are a plain read without lock or token")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.proxy = args.proxy.rstrip("/")
    _fix_faketime_sleep()
    log = EventLog(args.log, args.worker, args.incarnation)
    worker = Worker(args, log)

    def on_term(signum: int, frame: Any) -> None:
        worker.stopping = True

    signal.signal(signal.SIGTERM, on_term)
    log("start", pid=os.getpid(), mode=args.mode,
        faketime={k: v for k, v in os.environ.items() if k.startswith("FAKETIME")})
    try:
        worker.run()
    finally:
        log("stop")
        worker.close()
        log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
