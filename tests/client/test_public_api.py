"""The public client API is pinned: a change to ``lockd.__all__`` must be deliberate."""

from __future__ import annotations

import httpx
import pytest

import lockd
from lockd.client import errors

PUBLIC_API = [
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
    "FencedSession",
    "AsyncFencedSession",
    "fenced_transaction",
    "async_fenced_transaction",
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
    "LockError",
    "LockValueError",
]


def test_public_api_is_pinned():
    assert lockd.__all__ == PUBLIC_API
    for name in PUBLIC_API:
        assert getattr(lockd, name) is not None
    assert lockd.MAX_WAIT == 300.0 and lockd.DEFAULT_URL == "http://127.0.0.1:7070"
    assert [s.value for s in lockd.LeaseState] == ["held", "renewed", "unknown", "lost", "released"]


def test_every_error_is_one_hierarchy():
    for name in errors.__all__:
        obj = getattr(errors, name)
        if isinstance(obj, type):
            assert issubclass(obj, lockd.LockClientError), name
            assert obj.__doc__, name
    assert issubclass(lockd.AcquireTimeout, lockd.LockNotAcquired)
    assert issubclass(lockd.StaleTokenError, lockd.FencingError)
    assert issubclass(lockd.TransportError, lockd.ServiceUnavailable)
    # a Lock's misuse errors are still the built-ins they were before they joined the tree
    assert issubclass(lockd.LockError, RuntimeError)
    assert issubclass(lockd.LockValueError, ValueError)


def _problem(status: int, code: str | None, **extra) -> httpx.Response:
    body = {"type": f"urn:lockd:problem:{code}", "title": "t", "status": status, "detail": "d",
            **({"code": code} if code else {}), **extra}
    return httpx.Response(status, json=body, headers={"Retry-After": "3"})


@pytest.mark.parametrize(("status", "code", "cls"), [
    (409, "held", errors.LockNotAcquired),
    (410, "lease_lost", errors.LeaseLostError),
    (409, "stale_token", errors.StaleTokenError),
    (428, "token_required", errors.TokenRequired),
    (401, "invalid_token", errors.InvalidToken),
    (403, "lock_not_allowed", errors.LockNotAllowed),
    (401, "unauthorized", errors.PermissionDenied),
    (404, "not_found", errors.NotFoundError),
    (422, "invalid_request", errors.ValidationError),
    (413, "payload_too_large", errors.ValidationError),
    (503, "store_unavailable", errors.ServiceUnavailable),
    (429, "too_many_leases", errors.LimitExceeded),
    (429, "too_many_waiters", errors.LimitExceeded),
    (410, None, errors.LeaseLostError),       # no code: mapped by status
    (429, None, errors.LimitExceeded),
    (409, "limit_mismatch", errors.LimitMismatch),
    (409, "no_leader", errors.NoLeader),
    (403, "shared_token", errors.SharedTokenError),
    (502, None, errors.ServiceUnavailable),
    (500, None, errors.ServiceUnavailable),
    (418, None, errors.ProtocolError),
])
def test_problem_codes_and_statuses_map_to_types(status, code, cls):
    err = errors.error_from_response(_problem(status, code, lock="l", presented=3, highest=5,
                                              owner="o", ttl_ms=1200))
    assert type(err) is cls and err.status == status
    if cls is errors.StaleTokenError:
        assert (err.lock, err.presented, err.highest) == ("l", 3, 5)
    if cls is errors.LockNotAcquired:
        assert (err.owner, err.ttl_ms, err.retry_after) == ("o", 1200, 3.0)
    if cls is errors.SharedTokenError:
        assert err.lock == "l"


def test_a_limit_mismatch_says_the_current_limit():
    err = errors.error_from_response(_problem(409, "limit_mismatch", limit=4))
    assert isinstance(err, errors.LimitMismatch) and err.limit == 4
    assert not isinstance(err, errors.LockNotAcquired)  # not "held": acquire does not retry it


def test_an_identity_over_its_limit_is_told_when_to_retry():
    err = errors.error_from_response(_problem(429, "too_many_leases", identity="billing"))
    assert isinstance(err, errors.LimitExceeded) and err.retry_after == 3.0  # Retry-After


def test_a_non_json_error_body_still_maps_by_status():
    err = errors.error_from_response(httpx.Response(503, text="<html>bad gateway</html>"))
    assert isinstance(err, errors.ServiceUnavailable) and err.problem == {}
