"""The guard's typed errors: each is a ``lockd.common.problems.ProblemError``, so a service
answers it as the project's problem document (``problem()``: the body; ``status``).

::

    GuardError                500  internal          never raised for a client's input
    ├── TokenRequired         428  token_required    no ``Fencing-Token`` header
    ├── InvalidToken          401  invalid_token     malformed, bad signature, unknown key
    ├── LockNotAllowed        403  lock_not_allowed  a genuine token for another lock
    ├── SharedToken           403  shared_token      the token holds the lock shared: it
    │                                                never writes (``lock``)
    ├── StaleToken            409  stale_token       fence below the highest honoured
    │                                                (``lock``, ``presented``, ``highest``)
    └── KeysUnavailable       503  lockd_unreachable the token's key is unknown while lockd's
                                                     keys cannot be fetched (it may be genuine)

The codes and members are the resource proxy's (docs/fencing-protocol.md), so one client
(``FencedSession``) and one probe (``lockctl conformance``) read both.
"""

from __future__ import annotations

from lockd.common.problems import ProblemError

__all__ = ["GuardError", "TokenRequired", "InvalidToken", "LockNotAllowed", "SharedToken",
           "StaleToken", "KeysUnavailable"]


class GuardError(ProblemError):
    """Base of the guard's errors (``status``, ``code``, ``title``, ``detail``, ``extra``)."""


class TokenRequired(GuardError):
    """The request carries no ``Fencing-Token`` (428)."""

    status, code, title = 428, "token_required", "Fencing token required"


class InvalidToken(GuardError):
    """The token is malformed, badly signed or signed by a key lockd never published (401)."""

    status, code, title = 401, "invalid_token", "Invalid fencing token"


class LockNotAllowed(GuardError):
    """The token is genuine but does not hold the lock the resource is written under (403)."""

    status, code, title = 403, "lock_not_allowed", "Lock not allowed"

    def __init__(self, lock: str):
        super().__init__(f"the token does not hold lock {lock!r}", lock=lock)


class SharedToken(GuardError):
    """The token holds ``lock`` shared (a read lease): it never writes (403)."""

    status, code, title = 403, "shared_token", "Shared token cannot write"

    def __init__(self, lock: str):
        super().__init__(f"the token holds lock {lock!r} shared (a read lock): it may read, "
                         "not write; take the lock exclusive to write", lock=lock)


class StaleToken(GuardError):
    """The presented fence is below the highest the fence store has honoured for ``lock``
    (409): a newer holder has used the resource; nothing was written."""

    status, code, title = 409, "stale_token", "Stale fencing token"

    def __init__(self, lock: str, presented: int, highest: int):
        super().__init__(f"fence {presented} for lock {lock!r} is stale: the highest honoured "
                         f"is {highest}", lock=lock, presented=presented, highest=highest)
        self.lock, self.presented, self.highest = lock, presented, highest


class KeysUnavailable(GuardError):
    """The token's key is unknown and lockd's keys cannot be fetched (503): retry later."""

    status, code, title = 503, "lockd_unreachable", "lockd unreachable"
