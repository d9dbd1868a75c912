"""``FencedSession`` / ``AsyncFencedSession`` against a real proxy and lockd (both run via the
``make_api`` parametrization)."""

from __future__ import annotations

import random

import httpx
import pytest

from lockd import (
    FencingError,
    InvalidToken,
    LeaseRef,
    LeaseState,
    NotFoundError,
    StaleTokenError,
    ValidationError,
)
from lockd.client.fenced import encode_key


@pytest.fixture
def api(make_api, shared_lockd):
    return make_api(shared_lockd.url)


@pytest.fixture
def other(make_api, shared_lockd):
    return make_api(shared_lockd.url)


def _row_id() -> int:
    return random.randrange(1000, 10**9)


def _highest(proxy, lock: str) -> int:
    return httpx.get(f"{proxy.url}/v1/fences/{lock}").json()["highest"]


def test_rows_round_trip_through_the_proxy(api, proxy, name):
    rid = _row_id()
    lease = api.acquire(name, 5.0)
    db = api.session(proxy.url, lease)
    assert db.insert("items", {"id": rid, "owner": "o", "n": 1}) == {"id": rid, "owner": "o", "n": 1}
    assert db.claimed and db.highest == lease.fence
    assert db.upsert("items", rid, {"id": rid, "owner": "p", "n": 2})["owner"] == "p"
    assert db.update("items", rid, {"n": 3}) == {"id": rid, "owner": "p", "n": 3}
    assert db.get("items", rid)["n"] == 3
    assert db.select("items", {"owner": "p", "id": rid}) == [{"id": rid, "owner": "p", "n": 3}]
    assert (rid, "p", 3) in proxy.rows("items")
    db.delete("items", rid)
    with pytest.raises(NotFoundError):
        db.get("items", rid)
    with pytest.raises(NotFoundError):
        db.update("items", rid, {"n": 4})
    with pytest.raises(NotFoundError):
        db.delete("items", rid)
    api.release(lease)


def test_composite_key_with_a_comma_in_it(api, proxy, name):
    assert encode_key(("x,y", 2)) == "x%2Cy,2"
    lease = api.acquire(name, 5.0)
    db = api.session(proxy.url, lease)
    a = f"k,{_row_id()}"
    db.upsert("pairs", (a, 2), {"a": a, "b": 2, "v": "one"})
    assert db.get("pairs", [a, 2]) == {"a": a, "b": 2, "v": "one"}
    assert (a, 2, "one") in proxy.rows("pairs")
    api.release(lease)


def test_batch_is_all_or_nothing(api, proxy, name):
    r1, r2, missing = _row_id(), _row_id(), _row_id()
    lease = api.acquire(name, 5.0)
    db = api.session(proxy.url, lease)
    with pytest.raises(NotFoundError) as info:
        db.batch([
            {"op": "insert", "table": "items", "row": {"id": r1, "owner": "b", "n": 1}},
            {"op": "upsert", "table": "items", "key": r2, "row": {"id": r2, "owner": "b", "n": 2}},
            {"op": "update", "table": "items", "key": missing, "row": {"n": 9}},
        ])
    assert info.value.problem.get("op_index") == 2
    ids = {row[0] for row in proxy.rows("items")}
    assert r1 not in ids and r2 not in ids
    results = db.batch([
        {"op": "insert", "table": "items", "row": {"id": r1, "owner": "b", "n": 1}},
        {"op": "upsert", "table": "items", "key": [r2], "row": {"id": r2, "owner": "b", "n": 2}},
        {"op": "delete", "table": "items", "key": {"id": r1}},
    ])
    assert [r["op"] for r in results] == ["insert", "upsert", "delete"]
    ids = {row[0] for row in proxy.rows("items")}
    assert r1 not in ids and r2 in ids
    api.release(lease)


def test_first_use_claims_so_a_stale_write_after_a_read_is_rejected(api, other, proxy, name):
    """Invariant 7: B only *reads*, yet A's later write with the older fence is rejected."""
    rid = _row_id()
    lost = []
    a = api.acquire(name, 5.0, on_lost=lost.append)
    db_a = api.session(proxy.url, a)
    db_a.insert("items", {"id": rid, "owner": "A", "n": 1})
    other.release(LeaseRef(name, a.lease_id))  # A's lease ends behind A's back
    b = other.acquire(name, 5.0)
    assert b.fence > a.fence
    assert _highest(proxy, name) == a.fence
    db_b = other.session(proxy.url, b)
    assert db_b.get("items", rid)["owner"] == "A"  # a fenced read: claims first
    assert _highest(proxy, name) == b.fence
    with pytest.raises(StaleTokenError) as info:
        db_a.update("items", rid, {"owner": "A-late"})
    assert (info.value.presented, info.value.highest, info.value.lock) == (a.fence, b.fence, name)
    assert isinstance(info.value, FencingError) and info.value.status == 409
    assert (rid, "A", 1) in proxy.rows("items")
    # The stale answer proves the lease is gone: it is marked lost, on_lost fires once.
    assert api.wait_lost(a, 2.0) and a.state is LeaseState.LOST and lost == [a]
    other.release(b)


def test_forged_token_is_rejected_and_writes_nothing(api, proxy, name):
    rid = _row_id()
    lease = api.acquire(name, 5.0)
    header, claims, sig = lease.token.split(".")
    lease.token = ".".join([header, claims, sig[::-1]])
    db = api.session(proxy.url, lease)
    with pytest.raises(InvalidToken) as info:
        db.insert("items", {"id": rid, "owner": "forged", "n": 1})
    assert info.value.status == 401
    assert rid not in {row[0] for row in proxy.rows("items")}
    api.release(lease)


def test_proxy_validation_errors_are_typed(api, proxy, name):
    lease = api.acquire(name, 5.0)
    db = api.session(proxy.url, lease)
    with pytest.raises(NotFoundError):
        db.insert("no_such_table", {"id": 1})
    with pytest.raises(ValidationError) as info:
        db.insert("items", {"id": _row_id(), "no_such_column": 1})
    assert info.value.status == 422
    api.release(lease)
