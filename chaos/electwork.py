"""The ``election`` workload's operations: candidates campaign, leaders write a term log.

Each operation campaigns in election ``chaos/election`` (``POST /v1/elections/{E}/campaign``,
waiting up to ``--acquire-wait``, or half the time only 0.2 s, then campaigning again); once leader (``acquired {fence, mode: leader}``: the fence is
its term) it writes 1..4 entries of the ``terms`` table through the proxy with the leader's token
(whose lock is the election's name), one at a time:

- sometimes first a fenced read of the log (``POST /v1/fences/{E}/claim`` then a fenced list:
  ``read``; the nemesis's ``pause`` and ``kill_after_read`` freeze leaders there);
- per entry ``blind {via}`` (``pause_grant`` freezes it there), a think, ``write {mark = the
  entry id "<op>.<n>", term, n, via}`` and then ``ack``/``stale``/``rejected``/``unknown``
  naming the ``entry``; a refused entry ends the term (the leader has lost the lead);
- sometimes a ``proclaim`` of a new value between entries (its answer is not judged).

Renewal is ``POST /v1/elections/{E}/renew``; the operation ends with ``/resign``. A leader is
never told to stop writing when its lease lapses: the fence must stop it.
"""

from __future__ import annotations

from typing import Any

from chaos.rwwork import LeaseOps, RawLease, quoted
from lockd.client.errors import (
    LockClientError,
    ServiceUnavailable,
    StaleTokenError,
)

__all__ = ["ElectionOps", "ENTRY_VIAS"]

ENTRY_VIAS = ("post", "batch", "put")
IMPATIENT_WAIT_S = 0.2
"""The wait of an impatient candidate's campaign (s)."""


class ElectionOps(LeaseOps):
    """One worker's campaigns in election ``name`` (module docstring)."""

    def __init__(self, worker: Any, sleep: Any, name: str):
        super().__init__(worker, sleep)
        self.name = name
        self.base = f"/v1/elections/{quoted(name)}"

    def acquire(self) -> RawLease:
        """Campaign: patiently (``--acquire-wait``), or half the time with a short wait
        (``IMPATIENT_WAIT_S``), coming back at once: such candidates reach the store's campaign
        at any point of a leader's lease, its last moments too, instead of queuing until it
        ends."""
        value = f"{self.w.a.worker}.{self.w.a.incarnation}"
        wait = self.w.a.acquire_wait if self.w.rng.random() < 0.5 else IMPATIENT_WAIT_S
        return self._take(self.base, "campaign", {"value": value, "wait_ms": round(wait * 1000)},
                          mode="leader")

    def run(self, op: str, lease: RawLease) -> None:
        w = self.w
        self.sleep(w.rng.uniform(0.02, 0.06))  # setting up after the grant
        entries = w.rng.randint(1, 4)
        vias = [w.rng.choice(ENTRY_VIAS) for _ in range(entries)]
        if w.rng.random() < 0.4:
            try:
                w._plain("POST", f"/v1/fences/{quoted(lease.lock)}/claim", lease)
                seen = w._plain("GET", "/v1/tables/terms/rows?limit=5", lease)["items"]
            except LockClientError as exc:
                w._outcome(op, "read", exc, lease.fence)
                return
            w.log("read", op=op, fence=lease.fence, value=len(seen), via=vias[0], fenced=True)
            self._think()
        for n, via in enumerate(vias, start=1):
            if n > 1 and w.rng.random() < 0.2:
                try:
                    w._lockd(f"{self.base}/proclaim", {"lease_id": lease.lease_id,
                                                       "value": f"{op}.{n}"})
                except LockClientError:
                    pass  # lost the lead or lockd is down: the next entry finds out
            entry = f"{op}.{n}"
            w.log("blind", op=op, fence=lease.fence, via=via, entry=entry)
            self._think()
            if not self._entry(op, lease, entry, n, via):
                return

    def _entry(self, op: str, lease: RawLease, entry: str, n: int, via: str) -> bool:
        """Write one entry; whether it was acknowledged."""
        w = self.w
        row = {"id": entry, "term": lease.fence, "worker": w.a.worker, "n": n}
        w.log("write", op=op, fence=lease.fence, via=via, mark=entry, entry=entry, term=lease.fence,
              n=n)
        try:
            if via == "post":
                w._plain("POST", "/v1/tables/terms/rows", lease, row)
            elif via == "put":
                w._plain("PUT", f"/v1/tables/terms/rows/{entry}", lease, row)
            else:
                w._plain("POST", "/v1/batch", lease,
                         {"ops": [{"op": "insert", "table": "terms", "row": row}]})
        except LockClientError as exc:
            fields: dict[str, Any] = {"op": op, "phase": "write", "fence": lease.fence,
                                      "entry": entry, "status": exc.status, "code": exc.code}
            if isinstance(exc, StaleTokenError):
                w.log("stale", presented=exc.presented, highest=exc.highest, **fields)
            elif isinstance(exc, ServiceUnavailable) or not (exc.status and 400 <= exc.status < 500):
                w.log("unknown", **fields)
            else:
                w.log("rejected", **fields)
            return False
        w.log("ack", op=op, fence=lease.fence, via=via, mark=entry, entry=entry)
        return True
