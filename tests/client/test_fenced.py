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
from lockd.client.errors import LockClientError, LockNotAllowed
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


def _lock(api, proxy, table: str, key) -> str:
    """The lock the proxy names for a row, asked through a session that has no lease yet."""
    return api.session(proxy.url, None).lock_for(table, key)


def test_the_session_asks_the_proxy_for_a_rows_lock(api, proxy):
    rid = _row_id()
    db = api.session(proxy.url, None)
    assert db.lock_for("items", rid) == f"items/{rid}"
    assert db.lock_for("items", f"0{rid}") == f"items/{rid}", "the proxy canonicalises the key"
    assert db.lock_for("pairs", ("a b/c", 7)) == "pairs/a:20b:2Fc"
    with pytest.raises(ValidationError):
        db.lock_for("items")  # the template needs the key
    with pytest.raises(NotFoundError):
        db.lock_for("no_such_table", 1)
    with pytest.raises(LockClientError, match="no lease"):
        db.get("items", rid)  # nothing to fence with
    lease = api.acquire(db.lock_for("items", rid), 5.0)
    if api.kind == "sync":
        with db.using(lease) as bound:
            row = bound.upsert("items", rid, {"owner": "u", "n": 1})
            claimed = (bound.claimed, bound.highest)
    else:
        async def bound_write(session):
            async with session.using(lease) as bound:
                return await bound.upsert("items", rid, {"owner": "u", "n": 1}), (bound.claimed, bound.highest)

        row, claimed = api.run(bound_write(db._target))
    assert row["owner"] == "u" and claimed == (True, lease.fence)
    assert db.lease is None, "using() binds the lease for its block only"
    api.release(lease)


def test_a_write_under_another_lock_names_the_lock_needed(api, proxy, name):
    rid, other = _row_id(), _row_id()
    lease = api.acquire(_lock(api, proxy, "items", other), 5.0)  # the lock of ANOTHER row
    db = api.session(proxy.url, lease)
    with pytest.raises(LockNotAllowed) as info:
        db.upsert("items", rid, {"owner": "x", "n": 1})
    assert info.value.status == 403 and info.value.problem["lock"] == f"items/{rid}"
    assert rid not in {row[0] for row in proxy.rows("items")}
    api.release(lease)
    stray = api.acquire(name, 5.0)  # a lock that governs no row: even its claim is refused
    with pytest.raises(LockNotAllowed, match="governs no row"):
        api.session(proxy.url, stray).get("items", rid)
    api.release(stray)


def test_rows_round_trip_through_the_proxy(api, proxy):
    rid = _row_id()
    lease = api.acquire(_lock(api, proxy, "items", rid), 5.0)
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


def test_composite_key_with_a_comma_in_it(api, proxy):
    assert encode_key(("x,y", 2)) == "x%2Cy,2"
    a = f"k,{_row_id()}"
    lease = api.acquire(_lock(api, proxy, "pairs", (a, 2)), 5.0)
    db = api.session(proxy.url, lease)
    db.upsert("pairs", (a, 2), {"a": a, "b": 2, "v": "one"})
    assert db.get("pairs", [a, 2]) == {"a": a, "b": 2, "v": "one"}
    assert (a, 2, "one") in proxy.rows("pairs")
    api.release(lease)


def test_batch_is_all_or_nothing(api, proxy):
    a = f"batch-{_row_id()}"  # every pairs row with this ``a`` is under one lock
    lease = api.acquire(_lock(api, proxy, "pairs", (a, 1)), 5.0)
    db = api.session(proxy.url, lease)
    with pytest.raises(NotFoundError) as info:
        db.batch([
            {"op": "insert", "table": "pairs", "row": {"a": a, "b": 1, "v": "b"}},
            {"op": "upsert", "table": "pairs", "key": [a, 2], "row": {"v": "b"}},
            {"op": "update", "table": "pairs", "key": [a, 3], "row": {"v": "x"}},
        ])
    assert info.value.problem.get("op_index") == 2
    assert not [row for row in proxy.rows("pairs") if row[0] == a]
    results = db.batch([
        {"op": "insert", "table": "pairs", "row": {"a": a, "b": 1, "v": "b"}},
        {"op": "upsert", "table": "pairs", "key": [a, 2], "row": {"v": "b"}},
        {"op": "delete", "table": "pairs", "key": {"a": a, "b": 1}},
    ])
    assert [r["op"] for r in results] == ["insert", "upsert", "delete"]
    assert [row for row in proxy.rows("pairs") if row[0] == a] == [(a, 2, "b")]
    api.release(lease)


def test_first_use_claims_so_a_stale_write_after_a_read_is_rejected(api, other, proxy):
    """Invariant 7: B only *reads*, yet A's later write with the older fence is rejected."""
    rid = _row_id()
    name = _lock(api, proxy, "items", rid)
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


def test_forged_token_is_rejected_and_writes_nothing(api, proxy):
    rid = _row_id()
    lease = api.acquire(_lock(api, proxy, "items", rid), 5.0)
    header, claims, sig = lease.token.split(".")
    lease.token = ".".join([header, claims, sig[::-1]])
    db = api.session(proxy.url, lease)
    with pytest.raises(InvalidToken) as info:
        db.insert("items", {"id": rid, "owner": "forged", "n": 1})
    assert info.value.status == 401
    assert rid not in {row[0] for row in proxy.rows("items")}
    api.release(lease)


def test_proxy_validation_errors_are_typed(api, proxy):
    rid = _row_id()
    lease = api.acquire(_lock(api, proxy, "items", rid), 5.0)
    db = api.session(proxy.url, lease)
    with pytest.raises(NotFoundError):
        db.insert("no_such_table", {"id": 1})
    with pytest.raises(ValidationError) as info:
        db.insert("items", {"id": rid, "no_such_column": 1})
    assert info.value.status == 422
    api.release(lease)


def test_a_real_multi_lock_lease_fences_a_two_row_batch_end_to_end(shared_lockd, proxy):
    """lockd grants a multi-lock lease, FencedSession claims both locks and
    writes a two-row batch; after a newer single-lock holder of one row wrote, the old set's batch
    is refused as a whole (409 listing the stale lock) and neither row changes."""
    from lockd import FencedSession, LockClient, StaleTokenError

    a, b = _row_id(), _row_id()
    with LockClient(shared_lockd.url) as client:
        lease = client.acquire_many([f"items/{a}", f"items/{b}"], ttl=5)
        with FencedSession(proxy.url, lease) as db:
            db.batch([{"op": "upsert", "table": "items", "key": a, "row": {"owner": "set", "n": 1}},
                      {"op": "upsert", "table": "items", "key": b, "row": {"owner": "set", "n": 1}}])
            assert db.highests == lease.fences
        lease.release()  # the set ends; its token stays signed, but a newer grant outranks it
        newer = client.acquire(f"items/{b}", ttl=5)
        with FencedSession(proxy.url, newer) as db:
            db.upsert("items", b, {"owner": "newer", "n": 2})
        with FencedSession(proxy.url, lease) as stale, pytest.raises(StaleTokenError) as info:
            stale.batch([{"op": "update", "table": "items", "key": a, "row": {"n": 9}},
                         {"op": "update", "table": "items", "key": b, "row": {"n": 9}}])
        assert [s["lock"] for s in info.value.problem["stale"]] == [f"items/{b}"]
        assert lease.lost, "a stale answer marks the lease lost"
        newer.release()
    rows = {row[0]: row for row in proxy.rows("items")}
    assert rows[a][1:] == ("set", 1) and rows[b][1:] == ("newer", 2)
