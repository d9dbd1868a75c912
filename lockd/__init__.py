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

from lockd.client import (
    DEFAULT_URL,
    MAX_WAIT,
    AsyncElection,
    AsyncLeaderLease,
    AsyncLease,
    AsyncLockClient,
    AsyncMultiLease,
    AsyncPermitLease,
    AsyncSemaphore,
    Election,
    ElectionEvent,
    ElectionStatus,
    LeaderLease,
    Lease,
    LeaseRef,
    LeaseState,
    LockClient,
    LockStatus,
    MultiLease,
    PermitLease,
    Semaphore,
    SemaphoreStatus,
)
from lockd.client.errors import (
    AcquireTimeout,
    FencingError,
    InvalidToken,
    LeaseLostError,
    LimitExceeded,
    LimitMismatch,
    LockClientError,
    LockError,
    LockNotAcquired,
    LockNotAllowed,
    LockNotClaimedError,
    LockValueError,
    NoLeader,
    NotFoundError,
    PermissionDenied,
    ProtocolError,
    ServiceUnavailable,
    SharedTokenError,
    StaleTokenError,
    TokenRequired,
    TransactionStateError,
    TransportError,
    ValidationError,
)
from lockd.client.fenced import AsyncFencedSession, FencedSession
from lockd.client.sqlfence import async_fenced_transaction, fenced_transaction

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
