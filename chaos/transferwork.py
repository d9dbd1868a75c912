"""The ``transfer`` workload's operations: two-account transfers through multi-lock leases.

Each operation holds ``acquire_many`` of two random account locks (``accounts/<a>``,
``accounts/<b>``: one grant, one token, a fence per lock). A transfer reads both balances fenced
(the first read claims both locks), thinks, then sends ONE batch updating both rows (each row
names the transfer id in ``op``, its lock's fence and the balance read): ``acquired {fence =
the highest, fences}``, ``read {value, balances, via}``, ``write {src, dst, amount, reads}``.
Some operations (``TRANSFER_BLIND`` of them, by phase) are instead a blind multi-lock batch: no
claim, no read, one ``account_marks`` row per account, ``blind``/``write {mark}``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

import psycopg

from lockd.client.errors import LockClientError
from lockd.client.fenced import FencedSession

__all__ = ["TRANSFER_BLIND", "TransferOps"]

TRANSFER_BLIND = (0.85, 0.5, 0.2)
"""The share of blind multi-lock batches in each phase of the run (``Worker.phase``: blind, then
two others): a holder frozen at its grant in the blind phase is then mostly followed by a
blind batch too, which alone must raise every lock it writes (a transfer's claim raises them
before its batch)."""
_DIRECT_ERRORS = (psycopg.Error, sqlite3.Error, OSError)


class TransferOps:
    """One worker's transfers; ``w`` is the ``chaos.workload.Worker`` (its ``a``, ``rng``,
    ``log``, ``http``, ``direct``, ``_plain``, ``_outcome``)."""

    def __init__(self, worker: Any, sleep: Callable[[float], None]):
        self.w = worker
        self.sleep = sleep

    def run(self, op: str, lease: Any) -> None:
        """The ``transfer`` workload: move 1..50 from one account of the lease to the other,
        by a fenced read of both balances and one batch writing both (``nofence``: straight to
        the database in one transaction; ``unfenced-read``: plain reads, the batch with the
        token). The amount may exceed the balance: balances may go negative, only the sum and
        each row's history matter."""
        w = self.w
        fences = dict(getattr(lease, "fences", {}))
        share = TRANSFER_BLIND[w.phase()]
        if w.a.mode == "fenced" and w.rng.random() < share:
            self._blind_marks(op, lease, fences)
            return
        accounts = sorted(int(name.rsplit("/", 1)[1]) for name in fences)
        src, dst = (accounts if w.rng.random() < 0.5 else accounts[::-1])
        session = FencedSession(w.a.proxy, lease, timeout=w.a.timeout, http_client=w.http,
                                refuse_lost=False)  # the fence alone decides: what chaos tests
        self.sleep(w.rng.uniform(0.02, 0.06))  # setting up after the grant, before the claim
        reads: dict[int, int] = {}
        try:
            for account in (src, dst):
                if w.a.mode == "fenced":
                    reads[account] = int(session.get("accounts", account)["balance"])
                elif w.a.mode == "unfenced-read":
                    body = w._plain("GET", f"/v1/tables/accounts/rows/{account}", None)
                    reads[account] = int(body["balance"])
                else:
                    assert w.direct is not None
                    reads[account] = w.direct.read_balance(account)
        except (LockClientError, *_DIRECT_ERRORS) as exc:
            w._outcome(op, "read", exc, lease.fence)
            return
        w.log("read", op=op, fence=lease.fence, value=reads[src], fenced=w.a.mode == "fenced",
              via="batch", balances={str(k): v for k, v in reads.items()})
        self.sleep(w.rng.uniform(w.a.think_min, w.a.think_max))
        amount = w.rng.randint(1, 50)
        new = {src: reads[src] - amount, dst: reads[dst] + amount}
        w.log("write", op=op, fence=lease.fence, read=reads[src], wrote=new[src], via="batch",
              src=src, dst=dst, amount=amount, reads={str(k): v for k, v in reads.items()})
        rows = [(account, new[account], fences[f"accounts/{account}"], reads[account])
                for account in (src, dst)]
        try:
            if w.a.mode == "nofence":
                assert w.direct is not None
                w.direct.transfer(op, rows)
            else:
                ops = [{"op": "update", "table": "accounts", "key": account,
                        "row": {"balance": balance, "op": op, "fence": fence,
                                "read_balance": read}}
                       for account, balance, fence, read in rows]
                if w.a.mode == "fenced":
                    session.batch(ops)
                else:
                    w._plain("POST", "/v1/batch", lease, {"ops": ops})
        except (LockClientError, *_DIRECT_ERRORS) as exc:
            w._outcome(op, "write", exc, lease.fence)
            return
        w.log("ack", op=op, fence=lease.fence, read=reads[src], wrote=new[src], fences=fences)

    def _blind_marks(self, op: str, lease: Any, fences: dict[str, int]) -> None:
        """A blind multi-lock batch (``transfer`` workload): no claim and no read first, one
        ``account_marks`` row per account of the lease, so the batch's own fence check and raise
        of EVERY lock is all that stands between a frozen holder and a stale commit."""
        w = self.w
        w.log("blind", op=op, fence=lease.fence, via="batch", fences=fences)
        self.sleep(w.rng.uniform(w.a.think_min, w.a.think_max))
        ops = [{"op": "insert", "table": "account_marks",
                "row": {"account": int(name.rsplit("/", 1)[1]), "id": op, "fence": fence}}
               for name, fence in sorted(fences.items())]
        w.log("write", op=op, fence=lease.fence, via="batch", mark=op)
        try:
            w._plain("POST", "/v1/batch", lease, {"ops": ops})
        except LockClientError as exc:
            w._outcome(op, "write", exc, lease.fence)
            return
        w.log("ack", op=op, fence=lease.fence, via="batch", mark=op, fences=fences)
