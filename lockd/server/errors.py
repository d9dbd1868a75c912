"""The one typed error hierarchy of lockd, mapped to RFC 9457 problem details in ``api``.

::

    LockdError                      500  internal (never raised for client input)
    ├── InvalidRequest              422  invalid_request   bad name, TTL out of bounds, bad field
    │   └── PayloadTooLarge         413  payload_too_large
    ├── NotFound                    404  not_found
    ├── LockHeld                    409  held              not granted within wait_ms
    ├── NoLeader                    409  no_leader         a handover with nobody leading
    ├── LimitMismatch               409  limit_mismatch    semaphore held under another limit
    ├── ClientIdConflict            409  client_id_conflict  the client_id holds another lease
    ├── LeaseLost                   410  lease_lost        expired, released or unknown lease
    ├── Unauthorized                401  unauthorized
    ├── Forbidden                   403  forbidden
    │   └── ForbiddenLock           403  forbidden_lock    a lock outside the identity's prefixes
    ├── TooManyLeases               429  too_many_leases   the identity's live-lease limit
    ├── TooManyWaiters              429  too_many_waiters  the identity's queued-waiter limit
    └── StoreUnavailable            503  store_unavailable the store cannot answer; safe to retry

Every error carries ``code`` (the problem slug), ``status``, a human ``detail`` and optional
extension members (``extra``) that go into the problem body. Messages never contain lease ids.
"""

from __future__ import annotations

from lockd.common.problems import PROBLEM_TYPE_PREFIX, ProblemError

__all__ = [
    "PROBLEM_TYPE_PREFIX",
    "LockdError",
    "InvalidRequest",
    "PayloadTooLarge",
    "NotFound",
    "LockHeld",
    "NoLeader",
    "LimitMismatch",
    "ClientIdConflict",
    "LeaseLost",
    "Unauthorized",
    "Forbidden",
    "ForbiddenLock",
    "TooManyLeases",
    "TooManyWaiters",
    "StoreUnavailable",
]


class LockdError(ProblemError):
    """Base of every lockd error (``ProblemError``: status/code/title, ``detail``, ``extra``)."""


class InvalidRequest(LockdError):
    """The request is well-formed HTTP but its content is not acceptable (422)."""

    status, code, title = 422, "invalid_request", "Invalid request"


class PayloadTooLarge(InvalidRequest):
    """The request body exceeds the server's limit (413)."""

    status, code, title = 413, "payload_too_large", "Payload too large"


class NotFound(LockdError):
    """No such route or resource (404)."""

    status, code, title = 404, "not_found", "Not found"


class LockHeld(LockdError):
    """The lock was not granted within ``wait_ms`` (409).

    ``extra`` carries the holder's ``owner`` and remaining ``ttl_ms`` (never its lease id); the
    API adds a ``Retry-After`` header from ``ttl_ms``.
    """

    status, code, title = 409, "held", "Lock is held"


class NoLeader(LockdError):
    """A handover asked of an election nobody leads (409)."""

    status, code, title = 409, "no_leader", "No leader"


class LimitMismatch(LockdError):
    """A semaphore acquire named a ``limit`` other than the one its live permits hold (409).

    ``extra`` carries ``limit``: the semaphore's current limit.
    """

    status, code, title = 409, "limit_mismatch", "Semaphore limit mismatch"

    def __init__(self, detail: str, *, limit: int, **extra: object) -> None:
        super().__init__(detail, limit=limit, **extra)
        self.limit = limit


class ClientIdConflict(LockdError):
    """A ``client_id`` retry asked for another lease than the one that client_id holds live:
    another mode, another set of locks, or a campaign finding a lock lease (409). The live
    lease is neither returned nor changed: its mode is the store's record, never the route's.
    ``extra``: ``lock`` (or ``locks``) and ``held_mode`` when known; never a lease id."""

    status, code, title = 409, "client_id_conflict", "client_id holds another lease"


class LeaseLost(LockdError):
    """The lease is not live: it expired, was released, or never existed (410).

    A lost lease never comes back (an expired lease is never renewed or released back to
    life): acquire again for a new, higher fence.
    """

    status, code, title = 410, "lease_lost", "Lease lost"


class Unauthorized(LockdError):
    """Missing or wrong API key (401)."""

    status, code, title = 401, "unauthorized", "Unauthorized"


class Forbidden(LockdError):
    """The key is valid but not allowed to make this call (403)."""

    status, code, title = 403, "forbidden", "Forbidden"


class ForbiddenLock(Forbidden):
    """A lock outside the prefixes of the caller's identity (403). ``extra``: ``lock`` and
    ``identity`` (its name, never its key)."""

    code, title = "forbidden_lock", "Lock outside your scope"


class TooManyLeases(LockdError):
    """The caller's identity holds its limit of live leases at this lockd (429); the API adds
    ``Retry-After`` from ``extra["retry_after_s"]``."""

    status, code, title = 429, "too_many_leases", "Too many leases"


class TooManyWaiters(LockdError):
    """The caller's identity has its limit of acquires queued at this lockd (429, with
    ``Retry-After`` like ``TooManyLeases``)."""

    status, code, title = 429, "too_many_waiters", "Too many waiters"


class StoreUnavailable(LockdError):
    """The store did not answer (connection lost, no quorum, timeout); nothing was granted (503)."""

    status, code, title = 503, "store_unavailable", "Store unavailable"
