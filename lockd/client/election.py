"""``Election`` / ``AsyncElection``: leader election with the ``Lock`` object's shape, as
``client.election(name, value=...)`` returns it::

    election = client.election("jobs/scheduler", value="host-a:8080", ttl=10)
    with election.lead():                        # blocks until this candidate leads
        while not election.lost.is_set():        # renewed in the background meanwhile
            run_one_round(token=election.token)  # the token fences the leader's writes
    # resigned here: the next candidate leads at once

    for change in client.election("jobs/scheduler").observe():   # who leads, in order
        print(change.kind, change.owner, change.value, change.fence)

The leader is the exclusive holder of lock ``name``: its lease is renewed, lost (``lost``,
``on_lost``) and fenced like a lock's, and ``fence`` strictly increases with every new leader.
``campaign(blocking=True, timeout=None)`` is ``acquire``; ``resign()`` is ``release``;
``proclaim(value)`` changes the leader's value without a new term; ``leader()`` reads the
election; ``is_leader`` is this object's own view (``owned()``). When lockd asks the leader to
hand over (``handover(target)``, or an admin's), ``on_handover(lease, target)`` is called and the
leader resigns when it returns, or after ``handover_grace`` seconds (``lockd.client.leadership``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from lockd.client.leadership import (
    DEFAULT_HANDOVER_GRACE,
    AsyncLeaderLease,
    ElectionEvent,
    ElectionStatus,
    LeaderLease,
)
from lockd.client.lock import _LIVE, AsyncLock, Lock

__all__ = ["Election", "AsyncElection"]


class _ElectionRules:
    """What ``Election`` and ``AsyncElection`` share: the value, the handover settings, reading
    lockd's view."""

    value: str
    lease: Any
    on_handover: Callable[..., Any] | None
    handover_grace: float

    def _init_election(self, value: str, on_handover: Callable[..., Any] | None,
                       handover_grace: float) -> None:
        self.value = value
        """The value each campaign starts with; ``proclaim`` changes it."""
        self.on_handover = on_handover
        """Called as ``on_handover(lease, target)`` when lockd asks the leader to hand over."""
        self.handover_grace = handover_grace

    @property
    def is_leader(self) -> bool:
        """This object holds a live leader's lease (its own view, no request)."""
        return self.lease is not None and self.lease.state in _LIVE

    @property
    def handover_requested(self) -> Any:
        """The current lease's ``handover`` event (set when lockd asks it to hand over);
        ``None`` when not leading."""
        return self.lease.handover if self.lease is not None else None

    @staticmethod
    def _is_locked(status: ElectionStatus) -> bool:
        return status.leader is not None

    @staticmethod
    def _held_by(lease: Any, status: ElectionStatus) -> bool:
        """lockd shows this lease leading: a leader at this lease's fence (issued once) with this
        lease's owner label, and the lease live here."""
        return (lease.state in _LIVE and status.leader is not None
                and status.fence == lease.fence and status.leader == (lease.owner or ""))

    def _kw(self) -> dict[str, Any]:
        base: Any = super()
        return {**base._kw(), "on_handover": self.on_handover,
                "handover_grace": self.handover_grace}


class Election(_ElectionRules, Lock):
    """A reusable election candidate of ``LockClient`` (``client.election(name, value, ...)``)."""

    lease: LeaderLease | None  # type: ignore[assignment]

    def __init__(self, client: Any, name: str, value: str = "", ttl: float = 10.0, *,
                 wait: float | None = None, owner: str | None = None,
                 renew_every: float | None = None,
                 on_lost: Callable[[LeaderLease], Any] | None = None,
                 on_handover: Callable[[LeaderLease, str], Any] | None = None,
                 handover_grace: float = DEFAULT_HANDOVER_GRACE, auto_renew: bool = True):
        super().__init__(client, name, ttl, wait=wait, owner=owner, renew_every=renew_every,
                         on_lost=on_lost, auto_renew=auto_renew)
        self._init_election(value, on_handover, handover_grace)

    def _acquire_lease(self, wait: float | None) -> LeaderLease | None:
        if wait is None:
            return self.client.campaign(self.name, self.value, self.ttl, **self._kw())
        return self.client.try_campaign(self.name, self.value, self.ttl, wait=wait,
                                        **self._kw())

    def _enter_lease(self) -> LeaderLease:
        return self.client.campaign(self.name, self.value, self.ttl, wait=self.wait,
                                    **self._kw())

    def _status(self) -> ElectionStatus:
        return self.client.leader(self.name)

    def campaign(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Lead: True once leading, False if another still leads after ``timeout`` seconds
        (default: the object's ``wait``, ``None`` = forever) or at once with
        ``blocking=False``. See ``Lock.acquire`` for the errors."""
        return self.acquire(blocking, timeout)

    def resign(self) -> None:
        """Give up the lead (``Lock.release``): the next candidate leads at once."""
        self.release()

    def proclaim(self, value: str) -> int:
        """Set the leader's value (same term and fence); returns the change's ``seq``. Raises
        ``LockError`` when not leading, ``LeaseLostError`` if the lead was lost."""
        seq = self.client.proclaim(self._owned_lease("proclaim"), value)
        self.value = value
        return seq

    def leader(self) -> ElectionStatus:
        """The election at lockd now: leader, value, fence, time left, waiting candidates."""
        return self._status()

    def observe(self, **kw: Any) -> Iterator[ElectionEvent]:
        """``LockClient.observe`` of this election: its changes, in order, resuming on
        reconnect."""
        return self.client.observe(self.name, **kw)

    def handover(self, target: str = "next") -> str | None:
        """Ask lockd to hand this leader's lead to ``target`` (an owner label, or ``"next"``):
        the next renewal answers it, ``on_handover`` runs and this leader resigns."""
        return self.client.handover(self.name, target, lease=self._owned_lease("hand over"))

    @contextlib.contextmanager
    def lead(self) -> Iterator[Election]:
        """``with election.lead():`` campaigns (within the object's ``wait``, else
        ``AcquireTimeout``), leads while the block runs (renewed in the background) and
        resigns on exit, as ``with client.lock(...)`` releases."""
        self.__enter__()
        try:
            yield self
        except BaseException as exc:
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise
        self.__exit__(None, None, None)


class AsyncElection(_ElectionRules, AsyncLock):
    """The asyncio twin of ``Election``: ``await`` ``campaign()``, ``resign()``,
    ``proclaim()``, ``leader()``, ``handover()``; ``async with election.lead():``;
    ``async for change in election.observe():``."""

    lease: AsyncLeaderLease | None  # type: ignore[assignment]

    def __init__(self, client: Any, name: str, value: str = "", ttl: float = 10.0, *,
                 wait: float | None = None, owner: str | None = None,
                 renew_every: float | None = None,
                 on_lost: Callable[[AsyncLeaderLease], Any] | None = None,
                 on_handover: Callable[[AsyncLeaderLease, str], Any] | None = None,
                 handover_grace: float = DEFAULT_HANDOVER_GRACE, auto_renew: bool = True):
        super().__init__(client, name, ttl, wait=wait, owner=owner, renew_every=renew_every,
                         on_lost=on_lost, auto_renew=auto_renew)
        self._init_election(value, on_handover, handover_grace)

    async def _acquire_lease(self, wait: float | None) -> AsyncLeaderLease | None:
        if wait is None:
            return await self.client.campaign(self.name, self.value, self.ttl, **self._kw())
        return await self.client.try_campaign(self.name, self.value, self.ttl, wait=wait,
                                              **self._kw())

    async def _enter_lease(self) -> AsyncLeaderLease:
        return await self.client.campaign(self.name, self.value, self.ttl, wait=self.wait,
                                          **self._kw())

    async def _status(self) -> ElectionStatus:
        return await self.client.leader(self.name)

    async def campaign(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """See ``Election.campaign``."""
        return await self.acquire(blocking, timeout)

    async def resign(self) -> None:
        """See ``Election.resign``."""
        await self.release()

    async def proclaim(self, value: str) -> int:
        """See ``Election.proclaim``."""
        seq = await self.client.proclaim(self._owned_lease("proclaim"), value)
        self.value = value
        return seq

    async def leader(self) -> ElectionStatus:
        """See ``Election.leader``."""
        return await self._status()

    def observe(self, **kw: Any) -> AsyncIterator[ElectionEvent]:
        """See ``Election.observe`` (an async iterator)."""
        return self.client.observe(self.name, **kw)

    async def handover(self, target: str = "next") -> str | None:
        """See ``Election.handover``."""
        return await self.client.handover(self.name, target,
                                          lease=self._owned_lease("hand over"))

    @contextlib.asynccontextmanager
    async def lead(self) -> AsyncIterator[AsyncElection]:
        """``async with election.lead():``: see ``Election.lead``."""
        await self.__aenter__()
        try:
            yield self
        except BaseException as exc:
            await self.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        await self.__aexit__(None, None, None)
