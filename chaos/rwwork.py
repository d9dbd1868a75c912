"""The operations of the ``rw`` and ``sem`` workloads: shared locks and semaphore permits.

Both talk to lockd over plain HTTP (``RawLease``: the lease body of a shared lock, a permit or a
leadership, renewed and released by its own paths), and to the proxy with the lease's token.

``rw`` (``RwOps``): each operation is a *writer* (``1 - --readers`` of them) or a *reader*.

- A writer takes lock L exclusive and runs the ``counter`` workload's operation (a fenced
  read-modify-write of the counter, or a blind mark write: ``Worker._op_counter``).
- A reader takes L SHARED (its fence is the lock's write epoch), logs ``blind {mode: shared}``
  (the nemesis's ``pause_grant`` freezes it there, before anything reached the proxy), thinks,
  then either reads the counter fenced with its token (``GET`` of the row, a fenced list, or
  a claim-for-read ``POST /v1/fences/{L}/claim`` then the ``GET``), logging ``observe {value,
  wop, sent}`` (``sent``: uptime when the read left) or ``stale``; half of them read again
  after a think, still holding the lock (a writer whose lease lapsed must not change what
  they read: the nemesis's ``pause_shared`` thaws one right after a read); or (``--illicit`` of them)
  tries to WRITE under its shared token (PATCH/PUT of the counter, a batch, a mark insert, or
  ``POST /v1/fences/claim``): ``write {mark, shared: true}``, and the answer must be ``rejected``
  with ``code = shared_token``.

``sem`` (``SemOps``): each operation takes one permit of semaphore ``chaos`` (limit
``--limit``), logs ``acquired {mode: permit, slot, limit, fences: {sem/chaos/<slot>: fence}}``,
then ``blind``, thinks, and writes one ``slot_marks`` row of its slot with the permit's token
(blind: no claim first), ``write {mark}`` then ``ack``/``stale``/...
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from lockd.client.errors import LockClientError

__all__ = ["RawLease", "LeaseOps", "RwOps", "SemOps", "ILLICIT_VIAS", "quoted", "uptime"]

ILLICIT_VIAS = ("patch", "put", "batch", "post", "claim_all")
"""How a reader tries to write under its shared token (each must be 403 ``shared_token``)."""


@dataclass
class RawLease:
    """A lease lockd answered as JSON: ``lock`` (the token's lock), ``lease_id``, ``fence``,
    ``token``; ``base``: the lockd path it is renewed and released under (``/v1/locks/L``,
    ``/v1/semaphores/S``, ``/v1/elections/E``); ``log_fields``: what the ``acquired`` event adds."""

    lock: str
    lease_id: str
    fence: int
    token: str
    base: str
    log_fields: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_body(cls, body: dict[str, Any], base: str, **log_fields: Any) -> RawLease:
        return cls(str(body["lock"]), str(body["lease_id"]), int(body["fence"]),
                   str(body["token"]), base, dict(log_fields))


def uptime() -> float:
    """The machine's real uptime (s), as ``chaos.workload.uptime``: comparable across workers."""
    with open("/proc/uptime", "rb") as fh:
        return float(fh.read().split()[0])


def quoted(name: str) -> str:
    return quote(name, safe="/")


class LeaseOps:
    """Acquire (POST ``{base}/{verb}``), renew and release a ``RawLease`` through the worker's
    ``_lockd``; ``w`` is the ``chaos.workload.Worker``."""

    def __init__(self, worker: Any, sleep: Callable[[float], None]):
        self.w = worker
        self.sleep = sleep

    def _ttl_ms(self) -> int:
        return round(self.w.a.ttl * 1000)

    def _take(self, base: str, verb: str, body: dict[str, Any], **log_fields: Any) -> RawLease:
        answer = self.w._lockd(f"{base}/{verb}", {
            "ttl_ms": self._ttl_ms(), "wait_ms": round(self.w.a.acquire_wait * 1000),
            "owner": f"{self.w.a.worker}.{self.w.a.incarnation}", **body})  # body may set wait_ms
        return RawLease.from_body(answer, base, **log_fields)

    def renew(self, lease: RawLease) -> None:
        self.w._lockd(f"{lease.base}/renew", {"lease_id": lease.lease_id,
                                             "ttl_ms": self._ttl_ms()})

    def release(self, lease: RawLease) -> None:
        verb = "resign" if lease.base.startswith("/v1/elections/") else "release"
        self.w._lockd(f"{lease.base}/{verb}", {"lease_id": lease.lease_id})

    def _think(self) -> None:
        self.sleep(self.w.rng.uniform(self.w.a.think_min, self.w.a.think_max))


class RwOps(LeaseOps):
    """The ``rw`` workload's operations (module docstring)."""

    def acquire(self) -> Any:
        if self.w.rng.random() >= self.w.a.readers:  # a writer: the counter's exclusive lease
            return self.w.client.acquire(self.w.a.lock, self.w.a.ttl, wait=self.w.a.acquire_wait,
                                         auto_renew=False)
        return self._take(f"/v1/locks/{quoted(self.w.a.lock)}", "acquire", {"mode": "shared"},
                          mode="shared")

    def run(self, op: str, lease: Any) -> None:
        if not isinstance(lease, RawLease):
            self.w._op_counter(op, lease)
            return
        w = self.w
        self.sleep(w.rng.uniform(0.02, 0.06))  # setting up after the grant
        illicit = w.rng.random() < w.a.illicit
        via = w.rng.choice(ILLICIT_VIAS) if illicit else w.rng.choice(("get", "list", "claim"))
        w.log("blind", op=op, fence=lease.fence, via=via, mode="shared")
        self._think()
        if illicit:
            self._write(op, lease, via)
        elif self._read(op, lease, via) and w.rng.random() < 0.5:
            self._think()  # still holding the lock shared: nothing may change what it read
            self._read(op, lease, via)

    def _read(self, op: str, lease: RawLease, via: str) -> bool:
        """One fenced read (``via``); whether it was allowed (``observe``)."""
        w = self.w
        lock = w.a.lock
        sent = uptime()
        try:
            if via == "claim":
                w._plain("POST", f"/v1/fences/{quoted(lock)}/claim", lease)
            if via == "list":
                rows = w._plain("GET", "/v1/tables/counter/rows?id=1", lease)["items"]
                row = rows[0]
            else:
                row = w._plain("GET", "/v1/tables/counter/rows/1", lease)
        except LockClientError as exc:
            w._outcome(op, "read", exc, lease.fence)
            return False
        w.log("observe", op=op, fence=lease.fence, value=int(row["value"]), wop=row.get("op"),
              wfence=row.get("fence"), via=via, sent=sent)
        return True

    def _write(self, op: str, lease: RawLease, via: str) -> None:
        """A write under the shared token: the proxy must refuse it (403 ``shared_token``)."""
        w = self.w
        row = {"value": -1, "op": op, "worker": w.a.worker, "fence": lease.fence,
               "read_value": -1}
        w.log("write", op=op, fence=lease.fence, via=via, mark=op, shared=True)
        try:
            if via == "patch":
                w._plain("PATCH", "/v1/tables/counter/rows/1", lease, row)
            elif via == "put":
                w._plain("PUT", "/v1/tables/counter/rows/1", lease, {"id": 1, **row})
            elif via == "batch":
                w._plain("POST", "/v1/batch", lease, {"ops": [
                    {"op": "insert", "table": "marks",
                     "row": {"id": op, "worker": w.a.worker, "fence": lease.fence}}]})
            elif via == "post":
                w._plain("POST", "/v1/tables/marks/rows", lease,
                         {"id": op, "worker": w.a.worker, "fence": lease.fence})
            else:
                w._plain("POST", "/v1/fences/claim", lease)
        except LockClientError as exc:
            w._outcome(op, "write", exc, lease.fence)
            return
        w.log("ack", op=op, fence=lease.fence, via=via, mark=op, shared=True)


class SemOps(LeaseOps):
    """The ``sem`` workload's operations (module docstring); ``name``: the semaphore."""

    def __init__(self, worker: Any, sleep: Callable[[float], None], name: str):
        super().__init__(worker, sleep)
        self.name = name

    def acquire(self) -> RawLease:
        limit = self.w.a.limit
        lease = self._take(f"/v1/semaphores/{quoted(self.name)}", "acquire", {"limit": limit},
                           mode="permit", limit=limit)
        slot = int(lease.lock.rsplit("/", 1)[1])
        lease.log_fields.update(slot=slot, fences={lease.lock: lease.fence})
        return lease

    def run(self, op: str, lease: RawLease) -> None:
        w = self.w
        self.sleep(w.rng.uniform(0.02, 0.06))
        slot = lease.log_fields["slot"]
        w.log("blind", op=op, fence=lease.fence, via="post", slot=slot)
        self._think()
        w.log("write", op=op, fence=lease.fence, via="post", mark=op, slot=slot)
        try:
            w._plain("POST", "/v1/tables/slot_marks/rows", lease,
                     {"slot": slot, "id": op, "fence": lease.fence})
        except LockClientError as exc:
            w._outcome(op, "write", exc, lease.fence)
            return
        w.log("ack", op=op, fence=lease.fence, via="post", mark=op,
              fences={lease.lock: lease.fence})
