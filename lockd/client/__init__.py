"""The Python client side of lockd: it talks to lockd and the proxy over HTTP only.

::

    lease.py     Lease / AsyncLease, their states and background renewal, the clients' shared part
    lock.py      Lock / AsyncLock: the reusable lock object ``client.lock(name, ttl)`` returns
    sync.py      LockClient (threads)
    aio.py       AsyncLockClient (asyncio)
    fenced.py    FencedSession / AsyncFencedSession: fenced reads and writes through the proxy
    errors.py    the client error tree (LockClientError ...), mapped from problem details
    durations.py "500ms", "30s", "2m" for the command line
    lockctl.py   the ``lockctl`` command

Nothing here imports ``lockd.server`` (a wall checked by ``tests/test_layout.py``).
"""

from lockd.client.aio import AsyncLockClient
from lockd.client.lease import (
    DEFAULT_URL,
    MAX_WAIT,
    AsyncLease,
    AsyncMultiLease,
    Lease,
    LeaseRef,
    LeaseState,
    LockStatus,
    MultiLease,
)
from lockd.client.lock import AsyncLock, Lock
from lockd.client.sync import LockClient

__all__ = [
    "DEFAULT_URL",
    "MAX_WAIT",
    "LeaseState",
    "LeaseRef",
    "LockStatus",
    "Lease",
    "AsyncLease",
    "MultiLease",
    "AsyncMultiLease",
    "LockClient",
    "AsyncLockClient",
    "Lock",
    "AsyncLock",
]
