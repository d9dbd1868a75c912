"""lockd: a lease-and-fence distributed lock service, and its Python client.

The public client API is re-exported here::

    from lockd import LockClient, FencedSession, StaleTokenError

    client = LockClient("http://127.0.0.1:7070")
    with client.lock("jobs/nightly", ttl=30, wait=60) as lease:     # seconds
        FencedSession("http://127.0.0.1:7071", lease).upsert("reports", 1, {"id": 1})

The client lives in ``lockd.client``; the server in ``lockd.server`` (not imported here); what
both servers share in ``lockd.common`` and ``lockd.tokens``.

``lockd.__version__`` is the installed distribution's version (``lockd --version``); a source tree
that was never installed says ``0+unknown``.
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version

try:
    __version__: str = _dist_version("lockd")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

# The client API is imported on first use (PEP 562), so a server process that imports
# ``lockd.server`` or ``lockd.tokens`` does not load the client and httpx at start.
_LAZY = {
    "DEFAULT_URL": "lockd.client",
    "MAX_WAIT": "lockd.client",
    "AsyncElection": "lockd.client",
    "AsyncLeaderLease": "lockd.client",
    "AsyncLease": "lockd.client",
    "AsyncLockClient": "lockd.client",
    "AsyncMultiLease": "lockd.client",
    "AsyncPermitLease": "lockd.client",
    "AsyncSemaphore": "lockd.client",
    "Election": "lockd.client",
    "ElectionEvent": "lockd.client",
    "ElectionStatus": "lockd.client",
    "LeaderLease": "lockd.client",
    "Lease": "lockd.client",
    "LeaseRef": "lockd.client",
    "LeaseState": "lockd.client",
    "LockClient": "lockd.client",
    "LockStatus": "lockd.client",
    "MultiLease": "lockd.client",
    "PermitLease": "lockd.client",
    "Semaphore": "lockd.client",
    "SemaphoreStatus": "lockd.client",
    "AcquireTimeout": "lockd.client.errors",
    "FencingError": "lockd.client.errors",
    "InvalidToken": "lockd.client.errors",
    "LeaseLostError": "lockd.client.errors",
    "LimitExceeded": "lockd.client.errors",
    "LimitMismatch": "lockd.client.errors",
    "LockClientError": "lockd.client.errors",
    "LockError": "lockd.client.errors",
    "LockNotAcquired": "lockd.client.errors",
    "LockNotAllowed": "lockd.client.errors",
    "LockNotClaimedError": "lockd.client.errors",
    "LockValueError": "lockd.client.errors",
    "NoLeader": "lockd.client.errors",
    "NotFoundError": "lockd.client.errors",
    "PermissionDenied": "lockd.client.errors",
    "ProtocolError": "lockd.client.errors",
    "ServiceUnavailable": "lockd.client.errors",
    "SharedTokenError": "lockd.client.errors",
    "StaleTokenError": "lockd.client.errors",
    "TokenRequired": "lockd.client.errors",
    "TransactionStateError": "lockd.client.errors",
    "TransportError": "lockd.client.errors",
    "ValidationError": "lockd.client.errors",
    "AsyncFencedSession": "lockd.client.fenced",
    "FencedSession": "lockd.client.fenced",
    "async_fenced_transaction": "lockd.client.sqlfence",
    "fenced_transaction": "lockd.client.sqlfence",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lockd' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    # clients and leases
    "DEFAULT_URL",
    "MAX_WAIT",
    "LockClient",
    "AsyncLockClient",
    "Lease",
    "AsyncLease",
    "MultiLease",
    "AsyncMultiLease",
    "LeaseRef",
    "LeaseState",
    "LockStatus",
    # semaphores and elections
    "PermitLease",
    "AsyncPermitLease",
    "SemaphoreStatus",
    "Semaphore",
    "AsyncSemaphore",
    "LeaderLease",
    "AsyncLeaderLease",
    "ElectionStatus",
    "ElectionEvent",
    "Election",
    "AsyncElection",
    # fenced access to the protected resource
    "FencedSession",
    "AsyncFencedSession",
    "fenced_transaction",
    "async_fenced_transaction",
    # errors
    "LockClientError",
    "LockNotAcquired",
    "AcquireTimeout",
    "LeaseLostError",
    "FencingError",
    "StaleTokenError",
    "TokenRequired",
    "InvalidToken",
    "LockNotAllowed",
    "LockNotClaimedError",
    "TransactionStateError",
    "PermissionDenied",
    "LimitExceeded",
    "LimitMismatch",
    "NoLeader",
    "SharedTokenError",
    "NotFoundError",
    "ValidationError",
    "ServiceUnavailable",
    "TransportError",
    "ProtocolError",
    # misuse of a Lock object (also RuntimeError / ValueError)
    "LockError",
    "LockValueError",
]
