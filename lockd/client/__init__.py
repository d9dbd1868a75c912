"""The Python client side of lockd: it talks to lockd and the proxy over HTTP only.

::

    wire.py      the HTTP contract from the client's side: units, paths, names, lease bodies
    lease.py     Lease / AsyncLease (and multi-lock kinds), their states; LeaseRef, LockStatus
    core.py      every client rule that does no I/O (acquire retries, renewal timing, release)
    lock.py      Lock / AsyncLock: the reusable lock object ``client.lock(name, ttl)`` returns
    sync.py      LockClient (threads): only the I/O of the rules in core.py
    aio.py       AsyncLockClient (asyncio): the same, with ``await``
    fenced.py    FencedSession / AsyncFencedSession: fenced reads and writes through the proxy
    errors.py    the client error tree (LockClientError ...), mapped from problem details
    durations.py "500ms", "30s", "2m" for the command line
    lockctl.py   the ``lockctl`` command

Nothing here imports ``lockd.server`` (a wall checked by ``tests/test_layout.py``). The imports
run one way, ``wire`` <- ``lease`` <- ``core``, ``lock`` <- ``sync``, ``aio``; only this package
module imports the two clients (a lease or a ``Lock`` knows its client by a Protocol).
"""

import logging

from lockd.client.aio import AsyncLockClient
from lockd.client.lease import (
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
from lockd.client.wire import DEFAULT_URL, MAX_WAIT

# a library: silent unless the program configures logging
logging.getLogger("lockd.client").addHandler(logging.NullHandler())

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
