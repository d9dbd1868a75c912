"""The one rule for "may this token write this lock", and the fences every enforcement path checks.

A token holds each of its locks exclusively or shared (a read lease). A fence is taken from a
token for a ``Purpose``:

- ``WRITE``: only an exclusive hold qualifies; a shared hold raises ``SharedHold`` (each path
  maps it to its own error: the proxy's 403 ``shared_token``). A write claim lets the rows of
  the lock be written in its transaction.
- ``READ``: any hold. A read claim never lets a row be written.

Both raise the lock's highest fence to the presented one with the same conditional upsert
(``GREATEST``): a read epoch above a lapsed writer's fence fences that writer off. The fence
passes iff the upsert returns it (``stale``). No other module decides from a token's shared
claim (tests/test_layout.py keeps it so); docs/sql-fencing.md says why reads raise.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

from lockd.tokens import Claims

__all__ = ["Purpose", "WRITE", "READ", "SharedHold", "Fence", "fence_for", "fences_of",
           "in_lock_order", "stale"]


class Purpose(Enum):
    """What a fence is taken for: ``write`` (rows of the lock may be written) or ``read``."""

    WRITE = "write"
    READ = "read"


WRITE = Purpose.WRITE
READ = Purpose.READ


class SharedHold(Exception):
    """The token holds ``lock`` shared (a read lease) and the purpose is ``WRITE``."""

    def __init__(self, lock: str):
        super().__init__(f"the token holds lock {lock!r} shared: a shared lease never writes")
        self.lock = lock


@dataclass(frozen=True, slots=True)
class Fence:
    """A verified (lock, fence) pair taken from a token's claims for ``purpose``. ``multi``: the
    token is a multi-lock token (a 409 lists every stale lock); ``shared``: the token holds the
    lock shared (then ``purpose`` is ``READ``)."""

    lock: str
    fence: int
    multi: bool = False
    shared: bool = False
    purpose: Purpose = WRITE

    @property
    def writes(self) -> bool:
        """Whether this fence's claim lets the lock's rows be written."""
        return self.purpose is WRITE


def fence_for(claims: Claims, lock: str, purpose: Purpose | None) -> Fence | None:
    """The token's ``Fence`` for ``lock``, or None if the token does not hold ``lock``.

    ``purpose`` None: what the hold allows (``WRITE`` when exclusive, ``READ`` when shared).
    Raises ``SharedHold`` for ``WRITE`` under a shared hold."""
    fence = claims.locks.get(lock)
    if fence is None:
        return None
    shared = lock in claims.shared
    writing = purpose is WRITE or (purpose is None and not shared)
    if shared and writing:
        raise SharedHold(lock)
    return Fence(lock, fence, claims.multi, shared, WRITE if writing else READ)


def fences_of(claims: Claims, purpose: Purpose | None) -> list[Fence]:
    """A fence for every lock of the token, in lock-name order (``in_lock_order``), each for
    ``purpose`` (None: what its hold allows). ``SharedHold`` names the first shared lock when
    ``purpose`` is ``WRITE``."""
    out = []
    for lock in sorted(claims.locks):
        fence = fence_for(claims, lock, purpose)
        assert fence is not None
        out.append(fence)
    return out


def in_lock_order(fences: Iterable[Fence]) -> list[Fence]:
    """``fences`` sorted by lock name (code-point order, the ``COLLATE "C"`` order): the order
    in which every transaction that claims several fences locks their rows, so two such
    transactions never wait for each other in a cycle."""
    return sorted(fences, key=lambda f: f.lock)


def stale(fences: Sequence[Fence], highests: Sequence[int]) -> list[tuple[Fence, int]]:
    """``(fence, highest)`` of every fence the conditional upsert did not return: the highest
    honoured is above it (equal passes: the same epoch's next call)."""
    return [(f, h) for f, h in zip(fences, highests, strict=True) if h != f.fence]
