"""The one typed error hierarchy of the proxy, mapped to RFC 9457 problem details in ``api``.

::

    ProxyError                      500  internal           never raised for client input
    ├── InvalidRequest              422  invalid_request    bad JSON, unknown column, value of the
    │   │                                                   wrong type (``column``), bad key,
    │   │                                                   NOT NULL / CHECK violated
    │   └── PayloadTooLarge         413  payload_too_large  body above ``max_body_bytes``
    ├── NotFound                    404  not_found          unknown route, table outside the
    │                                                       allow-list, absent row
    ├── MethodNotAllowed            405  method_not_allowed
    ├── TokenRequired               428  token_required     no ``Fencing-Token`` header
    ├── InvalidTokenError           401  invalid_token      bad signature, unknown key, malformed
    ├── LockNotAllowed              403  lock_not_allowed   the policy does not let that lock write
    │                                                       that table (or that row)
    ├── ForbiddenTable              403  forbidden_table    the caller's identity (access file)
    │                                                       may not write or fenced-read that
    │                                                       table (``table``, ``identity``)
    ├── SharedToken                 403  shared_token       the token holds the lock SHARED (a
    │                                                       read lock): it may read, never write
    │                                                       or raise the fence (``lock``)
    ├── StaleToken                  409  stale_token        fence below the highest honoured
    │                                                       (``lock``, ``presented``, ``highest``)
    ├── Conflict                    409  conflict           UNIQUE / FOREIGN KEY / EXCLUDE violated
    ├── StoreUnavailable            503  database_unavailable  the database did not answer and
    │   │                                                   nothing was committed: safe to retry
    │   ├── BlobStoreUnavailable    503  blob_store_unavailable  the objects' directory or S3
    │   │                                                   endpoint failed (disk full, I/O)
    │   └── LockTimeout             503  lock_timeout       a fence row (or row) the request needs
    │                                                       stayed locked by another transaction
    │                                                       beyond ``lock_timeout_ms``: nothing
    │                                                       was committed, retry after a while
    ├── OutcomeUnknown              502  outcome_unknown    the connection broke while the write
    │                                                       (its COMMIT) was in flight: it may or
    │                                                       may not have committed
    ├── PreconditionFailed          412  precondition_failed  an object write's If-Match /
    │                                                       If-None-Match did not hold
    └── RangeNotSatisfiable         416  range_not_satisfiable  a GET's Range beyond the object

Why 502 and not 503 for ``outcome_unknown``: 503 says "the server could not handle the request"
and generic HTTP retry logic (load balancers, client middlewares) treats it as safe to retry,
which would write twice when the first attempt did commit. 502 ("the gateway got no valid
answer from the server behind it") is exactly the proxy's position in front of the database and
promises nothing about whether the request took effect; no ``Retry-After`` is sent with it.
The way to settle it is a retry with the same ``Idempotency-Key`` (``idempotency``).

Every error carries ``code`` (the problem slug), ``status``, a human ``detail`` and optional
extension members (``extra``, e.g. ``column``, ``op_index``) that go into the problem body.
``with_extra`` returns the same error with more members (the batch adds ``op_index``).
"""

from __future__ import annotations

from typing import Any

from lockd.common.problems import PROBLEM_TYPE_PREFIX, ProblemError

__all__ = [
    "PROBLEM_TYPE_PREFIX",
    "ProxyError",
    "InvalidRequest",
    "PayloadTooLarge",
    "NotFound",
    "MethodNotAllowed",
    "TokenRequired",
    "InvalidTokenError",
    "LockNotAllowed",
    "ForbiddenTable",
    "SharedToken",
    "StaleToken",
    "Conflict",
    "StoreUnavailable",
    "LockTimeout",
    "OutcomeUnknown",
    "LockdUnreachable",
    "PreconditionFailed",
    "RangeNotSatisfiable",
    "BlobStoreUnavailable",
]


class ProxyError(ProblemError):
    """Base of every proxy error (``ProblemError``: status/code/title, ``detail``, ``extra``)."""


class InvalidRequest(ProxyError):
    """Well-formed HTTP whose content is not acceptable (422); ``column`` names the culprit."""

    status, code, title = 422, "invalid_request", "Invalid request"


class PayloadTooLarge(InvalidRequest):
    """The request body exceeds ``max_body_bytes`` (413)."""

    status, code, title = 413, "payload_too_large", "Payload too large"


class NotFound(ProxyError):
    """No such route, no such table in the allow-list, or no such row (404)."""

    status, code, title = 404, "not_found", "Not found"


class MethodNotAllowed(ProxyError):
    """The route exists but not for this HTTP method (405)."""

    status, code, title = 405, "method_not_allowed", "Method not allowed"


class TokenRequired(ProxyError):
    """A write or claim came without a ``Fencing-Token`` header (428)."""

    status, code, title = 428, "token_required", "Fencing token required"


class InvalidTokenError(ProxyError):
    """The token is malformed, badly signed, or signed by a key lockd never published (401)."""

    status, code, title = 401, "invalid_token", "Invalid fencing token"


class LockNotAllowed(ProxyError):
    """The token is genuine but its lock may not write this table or row (403)."""

    status, code, title = 403, "lock_not_allowed", "Lock not allowed"


class ForbiddenTable(ProxyError):
    """The caller's identity (``--access-file``) may not write or fenced-read the table (403);
    the problem names the ``table`` and the ``identity``'s name, never its secret."""

    status, code, title = 403, "forbidden_table", "Table outside the identity's scope"


class ForbiddenBucket(ProxyError):
    """The caller's identity (``--access-file``) may not write or fenced-read the bucket's
    objects (403); the problem names the ``bucket`` and the ``identity``'s name."""

    status, code, title = 403, "forbidden_bucket", "Bucket outside the identity's scope"


class SharedToken(ProxyError):
    """The token holds ``lock`` in shared mode (a read lock) and the call would write under it
    or raise its fence (403): a shared lease may only do fenced reads and claims-for-read.
    Nothing was written or raised."""

    status, code, title = 403, "shared_token", "Shared token cannot write"

    def __init__(self, lock: str, action: str = "write"):
        super().__init__(f"the token holds lock {lock!r} shared (a read lock): it may read and "
                         f"claim-for-read, not {action}; take the lock exclusive to write",
                         lock=lock)


class StaleToken(ProxyError):
    """The presented fence is below the highest the resource has honoured for the lock (409).

    ``extra`` carries ``lock``, ``presented`` and ``highest`` (the first stale lock), and for a
    multi-lock token ``stale``: every stale lock as ``{lock, presented, highest}``, in lock
    order. Nothing was written: the holder lost its lease and somebody with a higher fence has
    used the resource since.
    """

    status, code, title = 409, "stale_token", "Stale fencing token"

    def __init__(self, lock: str, presented: int, highest: int, **extra: Any):
        detail = f"fence {presented} for lock {lock!r} is below the highest honoured fence {highest}"
        stale = extra.get("stale")
        if stale:  # a multi-lock token: every stale lock, in lock order
            detail = "the multi-lock token is stale for " + ", ".join(
                f"{s['lock']!r} (fence {s['presented']} < highest {s['highest']})" for s in stale)
        super().__init__(
            detail,
            lock=lock,
            presented=presented,
            highest=highest,
            **extra,
        )


class Conflict(ProxyError):
    """The write collides with other rows: UNIQUE, FOREIGN KEY or EXCLUDE constraint (409)."""

    status, code, title = 409, "conflict", "Conflict"


class StoreUnavailable(ProxyError):
    """The database did not answer (down, restarting, timeout) and nothing was committed: no
    connection was had, or the transaction failed before its COMMIT was sent, or the database
    answered with an error (503 ``database_unavailable``, ``Retry-After: 1``). Safe to retry."""

    status, code, title = 503, "database_unavailable", "Database unavailable"


class LockTimeout(StoreUnavailable):
    """A lock the request waited for (a lock's fence row: another transaction holds a claim on
    it, or a row) was not released within ``lock_timeout_ms`` (503 ``lock_timeout``,
    ``Retry-After: 1``): nothing was committed. The timeout keeps a claim held open elsewhere
    from tying up the proxy's connections and starving every other request."""

    status, code, title = 503, "lock_timeout", "Lock wait timed out"


class BlobStoreUnavailable(StoreUnavailable):
    """The blob store (the objects' directory or S3 endpoint) failed to store or read a body:
    disk full, I/O error, the endpoint unreachable (503 ``blob_store_unavailable``,
    ``Retry-After: 1``). Nothing was made visible; the partial blob is gone or an orphan."""

    status, code, title = 503, "blob_store_unavailable", "Blob store unavailable"


class OutcomeUnknown(ProxyError):
    """The connection to the database broke while a write (or its COMMIT) was in flight: it may
    or may not have committed (502 ``outcome_unknown``). Retry with the same Idempotency-Key."""

    status, code, title = 502, "outcome_unknown", "Outcome unknown"


class LockdUnreachable(ProxyError):
    """A token's key is not in the key set and the JWKS could not be fetched (503
    ``lockd_unreachable``, ``Retry-After: 1``): the token may well be genuine, so it is not
    called invalid; ``jwks_url`` names where the keys are fetched from."""

    status, code, title = 503, "lockd_unreachable", "lockd unreachable"


class PreconditionFailed(ProxyError):
    """An ``If-Match`` / ``If-None-Match: *`` of an object write did not hold (412); nothing was
    written (``etag``: the object's current ETag, None if it does not exist)."""

    status, code, title = 412, "precondition_failed", "Precondition failed"


class RangeNotSatisfiable(ProxyError):
    """A ``Range`` of a GET lies beyond the object's end (416; ``size``: its length)."""

    status, code, title = 416, "range_not_satisfiable", "Range not satisfiable"
