"""The one typed error hierarchy of the lockd client library (``LockClient``, ``FencedSession``).

Every failure the client raises derives from ``LockClientError``; foreign exceptions (``httpx``
transport errors, undecodable bodies) are translated at the boundary, the way ``httpx`` translates
``socket`` errors into its own, so callers never need ``except httpx.HTTPError``::

    LockClientError                    any client-side failure; .status/.code/.detail/.problem
    ├── LockNotAcquired                409 held: not granted (try_acquire returns None instead)
    │   └── AcquireTimeout             acquire(wait=...) gave up; .waited (seconds)
    ├── LeaseLostError                 410 lease_lost, or the local deadline passed unrenewed
    ├── FencingError                   the proxy refused a token
    │   ├── StaleTokenError            409 stale_token: .lock, .presented, .highest
    │   ├── TokenRequired              428 token_required
    │   ├── InvalidToken               401 invalid_token
    │   ├── LockNotAllowed             403 lock_not_allowed
    │   ├── SharedTokenError           403 shared_token: a shared (read) lease's token may not write
    │   └── LockNotClaimedError        SQL: the database refused a row whose lock was not claimed
    ├── TransactionStateError          SQL: fenced_transaction cannot use the connection's state
    ├── PermissionDenied               401/403 from lockd (unauthorized, forbidden)
    ├── LimitExceeded                  429 too_many_leases / too_many_waiters (per identity)
    ├── LimitMismatch                  409 limit_mismatch: a semaphore's permits are held under
    │                                  another limit; .limit is that one
    ├── NoLeader                       409 no_leader: a handover asked of an election nobody leads
    ├── NotFoundError                  404 unknown table, row or route
    ├── ValidationError                422 invalid_request (bad name, TTL out of bounds, bad column), 413
    ├── ServiceUnavailable             503 store_unavailable / database_unavailable: nothing was
    │   │                              written; safe to retry
    │   └── TransportError             no usable answer: connect refused, timeout, reset
    ├── OutcomeUnknown                 502 outcome_unknown (proxy): the write may or may not have
    │                                  committed; retry with the same Idempotency-Key
    ├── ProtocolError                  an answer the contract does not allow (bad JSON, odd status)
    ├── LockError                      a Lock used out of turn (release/extend unheld, acquire
    │                                  while holding); also a RuntimeError
    └── LockValueError                 a bad argument to a Lock (negative timeout, ...); also a
                                       ValueError

``ServiceUnavailable`` (and its ``TransportError``) are the *transient* errors: the background
renewal retries them until the lease's local deadline; everything else is final.

Problem bodies (RFC 9457) are matched by their ``code`` first, then by HTTP status, so a server
that adds a new code still maps to the right branch. Messages never contain lease ids.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, ClassVar

import httpx

from lockd.client.tlshints import TLS_HELP, tls_mistake

__all__ = [
    "LockClientError",
    "PreconditionFailed",
    "LockNotAcquired",
    "AcquireTimeout",
    "LeaseLostError",
    "FencingError",
    "StaleTokenError",
    "TokenRequired",
    "InvalidToken",
    "LockNotAllowed",
    "SharedTokenError",
    "LockNotClaimedError",
    "TransactionStateError",
    "PermissionDenied",
    "LimitExceeded",
    "LimitMismatch",
    "NoLeader",
    "NotFoundError",
    "ValidationError",
    "ServiceUnavailable",
    "TransportError",
    "OutcomeUnknown",
    "ProtocolError",
    "LockError",
    "LockValueError",
    "error_from_problem",
    "error_from_response",
    "body_or_raise",
    "translate_transport_errors",
    "wrong_server",
    "SERVER_HEADER",
]


class LockClientError(Exception):
    """Base of every client failure.

    ``status`` is the HTTP status (``None`` when there was no answer), ``code`` the problem slug,
    ``detail`` a human message and ``problem`` the full problem body (``{}`` if none).
    """

    default_code: ClassVar[str] = "client_error"

    def __init__(
        self,
        detail: str,
        *,
        status: int | None = None,
        code: str | None = None,
        problem: dict[str, Any] | None = None,
    ):
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.code = code or self.default_code
        self.problem = problem or {}


class LockNotAcquired(LockClientError):
    """The lock is held by someone else (lockd 409 ``held``).

    ``lock``, the holder's ``owner`` and remaining ``ttl_ms`` (never its lease id) and
    ``retry_after`` (seconds, from the ``Retry-After`` header) when lockd sent them.
    """

    default_code = "held"

    def __init__(self, detail: str, *, lock: str | None = None, owner: str | None = None,
                 ttl_ms: int | None = None, retry_after: float | None = None, **kw: Any):
        super().__init__(detail, **kw)
        self.lock = lock
        self.owner = owner
        self.ttl_ms = ttl_ms
        self.retry_after = retry_after


class AcquireTimeout(LockNotAcquired):
    """``acquire(wait=...)`` was not granted the lock within ``wait`` seconds (``waited``)."""

    def __init__(self, detail: str, *, waited: float, **kw: Any):
        super().__init__(detail, **kw)
        self.waited = waited


class LeaseLostError(LockClientError):
    """The lease is not live: lockd answered 410, or the local deadline passed without a renewal.

    A lost lease never comes back: acquire again for a new, higher fence.
    """

    default_code = "lease_lost"

    def __init__(self, detail: str, *, lock: str | None = None, **kw: Any):
        super().__init__(detail, **kw)
        self.lock = lock


class FencingError(LockClientError):
    """The fencing proxy refused the request because of its token."""


class StaleTokenError(FencingError):
    """The proxy has honoured a higher fence for this lock than the one presented (409).

    Someone acquired the lock after this lease: this holder's write was rejected and changed
    nothing. ``presented`` is this lease's fence, ``highest`` the proxy's.
    """

    default_code = "stale_token"

    def __init__(self, detail: str, *, lock: str | None = None, presented: int | None = None,
                 highest: int | None = None, **kw: Any):
        super().__init__(detail, **kw)
        self.lock = lock
        self.presented = presented
        self.highest = highest


class LockNotClaimedError(FencingError):
    """The database refused a row (SQLSTATE ``LF002``): this transaction wrote a row of ``lock``
    without claiming it. Claim it too (a multi-lock lease), or write only the leased rows.
    Nothing was committed. ``held``: the locks the transaction did claim (the message says
    which lock the row needs and that the table's installed lock template binds it)."""

    default_code = "lock_not_claimed"

    def __init__(self, detail: str, *, lock: str | None = None,
                 held: list[str] | None = None, **kw: Any):
        super().__init__(detail, **kw)
        self.lock = lock
        self.held = held or []


class TransactionStateError(LockClientError):
    """The connection's transaction cannot carry the claims (``code``): ``transaction_open``
    (one is already open; commit or roll back first), ``autocommit`` (every statement would
    commit alone), ``transaction_aborted`` (an error inside the block was caught there; the
    transaction was rolled back, nothing committed), ``fencing_not_installed`` (the database
    has no ``fencing`` schema or claim functions: run ``resource-proxy db install``),
    ``claim_not_granted`` (this role may not execute the claims: ``db install --claim-role``)."""

    default_code = "transaction_open"


class TokenRequired(FencingError):
    """The proxy needs a ``Fencing-Token`` header for this call (428)."""

    default_code = "token_required"


class InvalidToken(FencingError):
    """The proxy could not verify the token: bad signature, unknown key, malformed (401)."""

    default_code = "invalid_token"


class LockNotAllowed(FencingError):
    """The proxy's policy does not let this lock write this table or row (403)."""

    default_code = "lock_not_allowed"


class SharedTokenError(FencingError):
    """The proxy refused a write (or a claim to write) under the token of a shared lease (403
    ``shared_token``): a shared lease may read what ``lock`` governs, never write it. Take the
    lock exclusively to write. Nothing was written. ``fenced_transaction`` raises it when the
    database refused such a row (SQLSTATE ``LF003``: its lock was claimed for reading only)."""

    default_code = "shared_token"

    def __init__(self, detail: str, *, lock: str | None = None, **kw: Any):
        super().__init__(detail, **kw)
        self.lock = lock


class LimitMismatch(LockClientError):
    """A semaphore's live permits were granted under another ``limit`` than the one asked (409
    ``limit_mismatch``); ``limit`` is the semaphore's current one. Ask with that limit, or wait
    until no permit is held (then the semaphore takes the new limit). Not retried: the limit
    is part of the caller's configuration."""

    default_code = "limit_mismatch"

    def __init__(self, detail: str, *, limit: int | None = None, **kw: Any):
        super().__init__(detail, **kw)
        self.limit = limit


class NoLeader(LockClientError):
    """A handover was asked of an election that nobody leads (409 ``no_leader``)."""

    default_code = "no_leader"


class PermissionDenied(LockClientError):
    """lockd refused the caller (401 ``unauthorized`` / 403 ``forbidden``)."""

    default_code = "forbidden"


class NotFoundError(LockClientError):
    """No such table, row or route (404)."""

    default_code = "not_found"


class ValidationError(LockClientError):
    """The server rejected the request's content (422, 413): fix the request, do not retry."""

    default_code = "invalid_request"


class PreconditionFailed(LockClientError):
    """An object write's ``If-Match`` / ``If-None-Match: *`` did not hold (412); nothing was
    written. ``problem["etag"]``: the object's current ETag (None if it does not exist)."""

    default_code = "precondition_failed"


class LimitExceeded(LockClientError):
    """lockd refused the call because this identity is over one of its limits (429
    ``too_many_leases`` / ``too_many_waiters``): release leases or wait before acquiring more.
    ``retry_after``: seconds, from the ``Retry-After`` header, when lockd sent one."""

    default_code = "too_many_requests"

    def __init__(self, detail: str, *, retry_after: float | None = None, **kw: Any):
        super().__init__(detail, **kw)
        self.retry_after = retry_after


class ServiceUnavailable(LockClientError):
    """The service or its store could not answer (503); nothing was changed. Safe to retry."""

    default_code = "store_unavailable"


class TransportError(ServiceUnavailable):
    """No usable HTTP answer at all: connection refused or reset, timeout, DNS failure.

    ``url``: the server's base URL (``scheme://host:port``) when known; ``reason``: the
    transport's own words (e.g. ``ConnectError: [Errno 111] Connection refused``);
    ``unreachable``: no connection could be made (refused, DNS, connect timeout), so nothing
    was sent; ``tls``: a TLS mistake when one was recognised (``unknown_ca``: the server's
    certificate is not signed by a CA the client trusts; ``client_cert``: the server wants a
    client certificate (mTLS) and got none or refused it; ``plain_http``: an ``http://`` URL
    for a server that speaks https; ``not_tls``: an ``https://`` URL for one that does not);
    ``cause``: the transport's own exception. It is not chained (``raise ... from
    None``): a traceback shows this error alone, not the ~50 lines of httpx/httpcore below it.
    """

    default_code = "transport_error"

    def __init__(self, detail: str, *, url: str | None = None, reason: str | None = None,
                 unreachable: bool = False, cause: BaseException | None = None,
                 tls: str | None = None, **kw: Any):
        super().__init__(detail, **kw)
        self.url = url
        self.reason = reason
        self.unreachable = unreachable
        self.cause = cause
        self.tls = tls


class OutcomeUnknown(LockClientError):
    """The proxy lost its connection to the database while the write was being committed (502
    ``outcome_unknown``): it may or may not have taken effect. Not a ``ServiceUnavailable``: a
    blind retry could apply it twice. Retry with the same ``Idempotency-Key`` (which
    ``FencedSession`` does by itself) to get the original answer, or read to find out."""

    default_code = "outcome_unknown"


class ProtocolError(LockClientError):
    """The server answered something the contract does not allow (bad JSON, unexpected status)."""

    default_code = "protocol_error"


class LockError(LockClientError, RuntimeError):
    """A ``Lock`` was used out of turn: ``release``, ``extend`` or ``reacquire`` of a Lock that
    holds nothing (never acquired, or released), ``acquire`` of one that already holds its lock
    (a Lock is not re-entrant). A programming error: nothing was sent. Also a ``RuntimeError``,
    which these misuses raised before, and redis-py's name for them. ``lock`` is the lock name.
    """

    default_code = "lock_misuse"

    def __init__(self, detail: str, *, lock: str | None = None, **kw: Any):
        super().__init__(detail, **kw)
        self.lock = lock


class LockValueError(LockClientError, ValueError):
    """A bad argument to a ``Lock`` (a TTL, wait or timeout that is not a positive number of
    seconds, ``timeout`` with ``blocking=False``, ...): nothing was sent. Also a ``ValueError``,
    which these raised before. ``lock`` is the lock name."""

    default_code = "invalid_argument"

    def __init__(self, detail: str, *, lock: str | None = None, **kw: Any):
        super().__init__(detail, **kw)
        self.lock = lock


_BY_CODE: dict[str, type[LockClientError]] = {
    "held": LockNotAcquired,
    "lease_lost": LeaseLostError,
    "stale_token": StaleTokenError,
    "token_required": TokenRequired,
    "invalid_token": InvalidToken,
    "lock_not_allowed": LockNotAllowed,
    "shared_token": SharedTokenError,
    "limit_mismatch": LimitMismatch,
    "no_leader": NoLeader,
    "unauthorized": PermissionDenied,
    "forbidden": PermissionDenied,
    "not_found": NotFoundError,
    "invalid_request": ValidationError,
    "payload_too_large": ValidationError,
    "store_unavailable": ServiceUnavailable,
    "database_unavailable": ServiceUnavailable,
    "blob_store_unavailable": ServiceUnavailable,
    "outcome_unknown": OutcomeUnknown,
    "idempotency_key_reused": ValidationError,
    "precondition_failed": PreconditionFailed,
    "range_not_satisfiable": ValidationError,
    "too_many_leases": LimitExceeded,
    "too_many_waiters": LimitExceeded,
}

_BY_STATUS: dict[int, type[LockClientError]] = {
    401: PermissionDenied,
    403: PermissionDenied,
    404: NotFoundError,
    410: LeaseLostError,
    412: PreconditionFailed,
    416: ValidationError,
    429: LimitExceeded,
    413: ValidationError,
    422: ValidationError,
    428: TokenRequired,
    502: ServiceUnavailable,
    503: ServiceUnavailable,
    504: ServiceUnavailable,
}


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return float(response.headers["retry-after"])
    except (KeyError, ValueError):
        return None


SERVER_HEADER = "x-lockd-server"
"""The response header in which each server names itself (``lockd``, ``resource-proxy``)."""
DEFAULT_PORTS = {"lockd": 7070, "resource-proxy": 7071}


def wrong_server(response: httpx.Response, expected: str | None) -> ProtocolError | None:
    """``ProtocolError`` (``code="wrong_server"``) when ``response`` came from another server
    than ``expected`` (a client given the other server's URL or port); ``None`` otherwise, or
    when the server did not name itself."""
    got = response.headers.get(SERVER_HEADER)
    if expected is None or got is None or got == expected:
        return None
    url = response.request.url
    where = f"{url.scheme}://{url.netloc.decode('ascii', 'replace')}"
    port = DEFAULT_PORTS.get(expected)
    default = f", {expected}'s default port is {port}" if port else ""
    return ProtocolError(f"{where} is not {expected}: this is {got}{default}; check the URL "
                         f"(and port) given for {expected}", status=response.status_code,
                         code="wrong_server", problem={"server": got, "expected": expected})


def body_or_raise(method: str, path: str, response: httpx.Response,
                  server: str | None = None) -> Any:
    """The JSON body of a 2xx ``response`` (None for 204 or empty); the typed error otherwise.

    Raises ``ProtocolError`` when a 2xx body is not JSON, or (``code="wrong_server"``) when the
    answer came from another server than ``server`` (``lockd``, ``resource-proxy``).
    """
    if (other := wrong_server(response, server)) is not None:
        raise other
    if response.status_code >= 300:
        raise error_from_response(response)
    if response.status_code == 204 or not response.content:
        return None
    try:
        return response.json()
    except ValueError as exc:
        raise ProtocolError(f"{method} {path}: response is not JSON") from exc


def error_from_response(response: httpx.Response) -> LockClientError:
    """The typed error for a non-2xx ``response`` (a problem body or not).

    Matching is by problem ``code`` first, then by status; an unmapped status becomes
    ``ProtocolError`` (4xx) or ``ServiceUnavailable`` (5xx: the server failed, retrying may help).
    """
    problem: dict[str, Any] = {}
    with contextlib.suppress(ValueError):
        body = response.json()
        if isinstance(body, dict):
            problem = body
    return error_from_problem(response.status_code, problem, response.reason_phrase,
                              _retry_after(response))


def error_from_problem(status: int, problem: dict[str, Any], reason: str = "",
                       retry_after: float | None = None) -> LockClientError:
    """``error_from_response`` of an answer's ``status`` and ``problem`` body (``{}``: none)
    without the response itself: one lease's answer within ``POST /v1/leases/renew-each``."""
    code = problem.get("code") if isinstance(problem.get("code"), str) else None
    detail = problem.get("detail") or problem.get("title") or reason or "error"
    detail = f"{status} {detail}"
    cls = _BY_CODE.get(code or "") or _BY_STATUS.get(status)
    if cls is None:
        cls = ServiceUnavailable if status >= 500 else ProtocolError
    if cls is LockNotAcquired and status != 409:
        cls = ProtocolError
    kw: dict[str, Any] = {"status": status, "code": code, "problem": problem}
    if cls is LockNotAcquired:
        return LockNotAcquired(detail, lock=problem.get("lock"), owner=problem.get("owner"),
                               ttl_ms=_int_or_none(problem.get("ttl_ms")),
                               retry_after=retry_after, **kw)
    if cls is LimitExceeded:
        return LimitExceeded(detail, retry_after=retry_after, **kw)
    if cls is LeaseLostError:
        return LeaseLostError(detail, lock=problem.get("lock"), **kw)
    if cls is LimitMismatch:
        return LimitMismatch(detail, limit=_int_or_none(problem.get("limit")), **kw)
    if cls is SharedTokenError:
        return SharedTokenError(detail, lock=problem.get("lock"), **kw)
    if cls is StaleTokenError:
        return StaleTokenError(detail, lock=problem.get("lock"),
                               presented=_int_or_none(problem.get("presented")),
                               highest=_int_or_none(problem.get("highest")), **kw)
    return cls(detail, **kw)


@contextlib.contextmanager
def translate_transport_errors(what: str, *, has_cert: bool = False) -> Iterator[None]:
    """Re-raise ``httpx`` errors raised inside the block as ``TransportError``/``ProtocolError``.

    ``what`` names the call for the message (e.g. ``"POST /v1/locks/x/renew"``). A refused or
    failed connection names the server's URL and asks whether it is running there::

        GET /v1/locks/x: cannot reach http://127.0.0.1:7070 (ConnectError: [Errno 111]
        Connection refused); is the server running there, and is that the right URL?

    TLS mistakes get their own message naming the setting to fix (``TransportError.tls``):
    an unknown CA (``verify=``), a missing client certificate under mTLS (``cert=``; whether
    the client presented one is ``has_cert``), ``http://`` to an https server and back.
    """
    try:
        yield
    except httpx.TimeoutException as exc:
        url = _base_url(exc)
        raise TransportError(f"{what}: timed out ({type(exc).__name__})", url=url,
                             reason=type(exc).__name__, cause=exc,
                             unreachable=isinstance(exc, httpx.ConnectTimeout)) from None
    except httpx.LocalProtocolError as exc:
        raise ProtocolError(f"{what}: {type(exc).__name__}: {exc}") from exc
    except httpx.ConnectError as exc:
        url, reason = _base_url(exc), f"{type(exc).__name__}: {exc}"
        tls = tls_mistake(exc, url, has_cert)
        if tls is not None:
            raise TransportError(f"{what}: {TLS_HELP[tls].format(url=url, reason=reason)}",
                                 url=url, reason=reason, cause=exc, tls=tls) from None
        raise TransportError(
            f"{what}: cannot reach {url or 'the server'} ({reason}); is the server running "
            "there, and is that the right URL?", url=url, reason=reason, unreachable=True,
            cause=exc) from None
    except httpx.TransportError as exc:
        # Includes RemoteProtocolError (the server went away mid-answer): transient.
        url, reason = _base_url(exc), f"{type(exc).__name__}: {exc}"
        tls = tls_mistake(exc, url, has_cert)
        if tls is not None:
            raise TransportError(f"{what}: {TLS_HELP[tls].format(url=url, reason=reason)}",
                                 url=url, reason=reason, cause=exc, tls=tls) from None
        raise TransportError(f"{what}: {reason}", url=url, reason=reason,
                             cause=exc) from None
    except (httpx.DecodingError, httpx.TooManyRedirects) as exc:
        raise ProtocolError(f"{what}: {type(exc).__name__}: {exc}") from exc


def _base_url(exc: httpx.RequestError) -> str | None:
    """``scheme://host[:port]`` of the request that failed (``None`` if httpx did not say)."""
    try:
        url = exc.request.url
    except RuntimeError:  # raised outside a request
        return None
    return f"{url.scheme}://{url.netloc.decode('ascii', 'replace')}"
