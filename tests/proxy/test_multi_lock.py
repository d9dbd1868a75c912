"""Multi-lock tokens at the proxy, on SQLite and PostgreSQL: a batch may carry one
token holding several locks; each op must be bound to one of them; the fence of every lock the
batch touches is checked and raised in the batch's transaction, all or nothing.

Tokens are minted with the deployment's ``KeyRing.sign_many`` (the multi-lock format lockd
signs); the accounts are seeded straight into the database, so no fence is raised before the
test's own calls.
"""

from __future__ import annotations

import asyncio
from decimal import Decimal

import pytest

from lockd.client.errors import StaleTokenError
from lockd.client.fenced import AsyncFencedSession, FencedSession
from tests.proxy.conftest import Deployment, assert_problem, unique_id


def _accounts(d: Deployment, *balances: int) -> list[int]:
    ids = [unique_id() for _ in balances]
    for account, balance in zip(ids, balances, strict=True):
        d.db.query("INSERT INTO accounts (id, balance) VALUES (?, ?)", (account, balance))
    return ids


def _state(d: Deployment, account: int) -> tuple[Decimal, int | None]:
    [(balance, last_fence)] = d.db.query(
        "SELECT balance, last_fence FROM accounts WHERE id = ?", (account,))
    return Decimal(str(balance)), last_fence


def _highest(d: Deployment, lock: str) -> int:
    return d.client.get(f"/v1/fences/{lock}").json()["highest"]


def _multi(d: Deployment, fences: dict[str, int]) -> dict[str, str]:
    return {"Fencing-Token": d.ring.sign_many(fences)}


def _transfer(a: int, b: int, new_a: int, new_b: int) -> dict:
    return {"ops": [
        {"op": "update", "table": "accounts", "key": a, "row": {"balance": new_a}},
        {"op": "update", "table": "accounts", "key": b, "row": {"balance": new_b}},
    ]}


def test_transfer_batch_under_a_multi_lock_token(deployment: Deployment):
    d = deployment
    a, b = _accounts(d, 100, 5)
    token = _multi(d, {f"accounts/{a}": 7, f"accounts/{b}": 3})
    r = d.client.post("/v1/batch", headers=token, json=_transfer(a, b, 60, 45))
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["lock"], body["fence"]) == (None, None)
    assert body["locks"] == sorted([{"lock": f"accounts/{a}", "fence": 7},
                                    {"lock": f"accounts/{b}", "fence": 3}],
                                   key=lambda x: x["lock"])
    # each row's fence column gets the fence of ITS lock
    assert _state(d, a) == (Decimal(60), 7) and _state(d, b) == (Decimal(45), 3)
    assert (_highest(d, f"accounts/{a}"), _highest(d, f"accounts/{b}")) == (7, 3)


def test_op_on_a_lock_the_token_does_not_hold_is_403_and_writes_nothing(deployment: Deployment):
    d = deployment
    a, b, c = _accounts(d, 10, 10, 10)
    token = _multi(d, {f"accounts/{a}": 4, f"accounts/{b}": 4})
    ops = _transfer(a, b, 5, 15)["ops"] + [
        {"op": "update", "table": "accounts", "key": c, "row": {"balance": 0}}]
    problem = assert_problem(d.client.post("/v1/batch", headers=token, json={"ops": ops}),
                             403, "lock_not_allowed")
    assert (problem["lock"], problem["op_index"]) == (f"accounts/{c}", 2)
    assert problem["token_locks"] == sorted([f"accounts/{a}", f"accounts/{b}"])
    assert [_state(d, x) for x in (a, b, c)] == [(Decimal(10), None)] * 3
    assert [_highest(d, f"accounts/{x}") for x in (a, b, c)] == [0, 0, 0]
    # the same for a single-row write and a fenced read of an unheld row
    assert_problem(d.client.patch(f"/v1/tables/accounts/rows/{c}", headers=token,
                                  json={"balance": 1}), 403, "lock_not_allowed")
    assert_problem(d.client.get(f"/v1/tables/accounts/rows/{c}", headers=token),
                   403, "lock_not_allowed")
    assert _state(d, c) == (Decimal(10), None) and _highest(d, f"accounts/{c}") == 0


def test_stale_fence_on_one_of_two_locks_refuses_the_whole_batch(deployment: Deployment):
    d = deployment
    a, b = _accounts(d, 50, 50)
    la, lb = f"accounts/{a}", f"accounts/{b}"
    assert d.client.post(f"/v1/fences/{lb}/claim", headers=d.auth(lb, 9)).status_code == 200
    r = d.client.post("/v1/batch", headers=_multi(d, {la: 5, lb: 8}), json=_transfer(a, b, 0, 100))
    problem = assert_problem(r, 409, "stale_token")
    assert problem["stale"] == [{"lock": lb, "presented": 8, "highest": 9}]
    assert (problem["lock"], problem["presented"], problem["highest"]) == (lb, 8, 9)
    assert _state(d, a) == (Decimal(50), None) and _state(d, b) == (Decimal(50), None)
    assert (_highest(d, la), _highest(d, lb)) == (0, 9), "the fresh lock's fence was raised"


def test_every_stale_lock_is_listed_in_lock_order(deployment: Deployment):
    d = deployment
    a, b = _accounts(d, 1, 1)
    la, lb = sorted([f"accounts/{a}", f"accounts/{b}"])
    for lock in (la, lb):
        d.client.post(f"/v1/fences/{lock}/claim", headers=d.auth(lock, 20))
    r = d.client.post("/v1/batch", headers=_multi(d, {la: 11, lb: 12}), json=_transfer(a, b, 2, 0))
    assert assert_problem(r, 409, "stale_token")["stale"] == [
        {"lock": la, "presented": 11, "highest": 20}, {"lock": lb, "presented": 12, "highest": 20}]


def test_single_lock_409_keeps_its_shape(deployment: Deployment):
    d = deployment
    [a] = _accounts(d, 3)
    lock = f"accounts/{a}"
    d.client.post(f"/v1/fences/{lock}/claim", headers=d.auth(lock, 2))
    r = d.client.post("/v1/batch", headers=d.auth(lock, 1), json={"ops": [
        {"op": "update", "table": "accounts", "key": a, "row": {"balance": 0}}]})
    problem = assert_problem(r, 409, "stale_token")
    assert (problem["lock"], problem["presented"], problem["highest"]) == (lock, 1, 2)
    assert "stale" not in problem


def test_only_the_touched_locks_are_checked_and_raised(deployment: Deployment):
    d = deployment
    a, b, c = _accounts(d, 10, 10, 10)
    la, lb, lc = (f"accounts/{x}" for x in (a, b, c))
    d.client.post(f"/v1/fences/{lc}/claim", headers=d.auth(lc, 50))  # c's fence is stale
    r = d.client.post("/v1/batch", headers=_multi(d, {la: 6, lb: 6, lc: 6}),
                      json=_transfer(a, b, 4, 16))
    assert r.status_code == 200, r.text
    assert [x["lock"] for x in r.json()["locks"]] == sorted([la, lb])
    assert (_highest(d, la), _highest(d, lb), _highest(d, lc)) == (6, 6, 50)
    assert _state(d, a) == (Decimal(4), 6) and _state(d, b) == (Decimal(16), 6)


def test_single_row_writes_and_fenced_reads_with_a_multi_lock_token(deployment: Deployment):
    d = deployment
    a, b = _accounts(d, 10, 20)
    la, lb = f"accounts/{a}", f"accounts/{b}"
    token = _multi(d, {la: 3, lb: 4})
    r = d.client.patch(f"/v1/tables/accounts/rows/{b}", headers=token, json={"balance": 21})
    assert r.status_code == 200, r.text
    assert _state(d, b) == (Decimal(21), 4) and (_highest(d, la), _highest(d, lb)) == (0, 4)
    read = d.client.get(f"/v1/tables/accounts/rows/{a}", headers=token)
    assert read.status_code == 200 and Decimal(read.json()["balance"]) == 10
    assert _highest(d, la) == 3, "a fenced read raises the row's lock to the token's fence"
    listed = d.client.get("/v1/tables/accounts/rows", params={"id": b}, headers=token)
    assert [row["id"] for row in listed.json()["items"]] == [b]
    d.client.post(f"/v1/fences/{la}/claim", headers=d.auth(la, 5))
    stale = assert_problem(d.client.get(f"/v1/tables/accounts/rows/{a}", headers=token),
                           409, "stale_token")
    assert stale["stale"] == [{"lock": la, "presented": 3, "highest": 5}]


def test_claim_all_raises_every_lock_or_none(deployment: Deployment):
    d = deployment
    a, b = _accounts(d, 1, 1)
    la, lb = sorted([f"accounts/{a}", f"accounts/{b}"])
    r = d.client.post("/v1/fences/claim", headers=_multi(d, {la: 4, lb: 2}))
    assert r.status_code == 200, r.text
    assert r.json() == {"locks": [{"lock": la, "highest": 4}, {"lock": lb, "highest": 2}]}
    problem = assert_problem(d.client.post("/v1/fences/claim", headers=_multi(d, {la: 9, lb: 1})),
                             409, "stale_token")
    assert problem["stale"] == [{"lock": lb, "presented": 1, "highest": 2}]
    assert (_highest(d, la), _highest(d, lb)) == (4, 2), "a refused claim raises nothing"
    # one lock of a multi-lock token at the single-lock claim route; a lock it lacks is 403
    one = d.client.post(f"/v1/fences/{la}/claim", headers=_multi(d, {la: 6, lb: 6}))
    assert one.json() == {"lock": la, "highest": 6} and _highest(d, lb) == 2
    assert_problem(d.client.post(f"/v1/fences/accounts/{unique_id()}/claim",
                                 headers=_multi(d, {la: 7})), 403, "lock_not_allowed")
    # every lock must govern a served row, else nothing is claimed
    assert_problem(d.client.post("/v1/fences/claim", headers=_multi(d, {la: 8, "nowhere": 8})),
                   403, "lock_not_allowed")
    assert _highest(d, la) == 6
    assert_problem(d.client.post("/v1/fences/claim"), 428, "token_required")


def test_revived_multi_lock_holder_is_refused_after_a_newer_single_lock_holder_wrote(
        deployment: Deployment):
    d = deployment
    a, b = _accounts(d, 100, 0)
    la, lb = f"accounts/{a}", f"accounts/{b}"
    old = _multi(d, {la: 5, lb: 5})
    assert d.client.post("/v1/fences/claim", headers=old).status_code == 200
    assert d.client.post("/v1/batch", headers=old, json=_transfer(a, b, 90, 10)).status_code == 200
    # the multi-lock lease expires; a single-lock holder of accounts/a (fence 6) writes
    newer = d.client.patch(f"/v1/tables/accounts/rows/{a}", headers=d.auth(la, 6),
                           json={"balance": 80})
    assert newer.status_code == 200, newer.text
    # the old holder wakes up and sends its next transfer
    r = d.client.post("/v1/batch", headers=old, json=_transfer(a, b, 0, 100))
    assert assert_problem(r, 409, "stale_token")["stale"] == [
        {"lock": la, "presented": 5, "highest": 6}]
    assert _state(d, a) == (Decimal(80), 6) and _state(d, b) == (Decimal(10), 5)
    assert _highest(d, lb) == 5


def test_keyed_multi_lock_batch_replays(deployment: Deployment):
    d = deployment
    a, b = _accounts(d, 30, 0)
    token = {**_multi(d, {f"accounts/{a}": 2, f"accounts/{b}": 2}),
             "Idempotency-Key": f"k{unique_id()}"}
    first = d.client.post("/v1/batch", headers=token, json=_transfer(a, b, 20, 10))
    again = d.client.post("/v1/batch", headers=token, json=_transfer(a, b, 20, 10))
    assert first.status_code == again.status_code == 200, again.text
    assert again.headers.get("idempotency-replayed") == "true" and again.json() == first.json()
    other = d.client.post("/v1/batch", headers=token, json=_transfer(a, b, 0, 30))
    assert_problem(other, 422, "idempotency_key_reused")
    assert _state(d, a) == (Decimal(20), 2)


class _StandInLease:
    """A multi-lock lease as ``FencedSession`` sees it (``client.acquire_many`` returns one)."""

    def __init__(self, token: str, fences: dict[str, int]):
        self.token, self.fences, self.lost = token, fences, False

    def _mark_lost(self, reason: object) -> bool:
        self.lost = True
        return True


def test_fenced_session_claims_every_lock_of_a_multi_lock_lease(deployment: Deployment):
    d = deployment
    a, b = _accounts(d, 70, 30)
    with FencedSession(d.url) as db:
        la, lb = db.lock_for("accounts", a), db.lock_for("accounts", b)  # no lease needed
        assert (la, lb) == (f"accounts/{a}", f"accounts/{b}")
        fences = {la: 12, lb: 13}
        lease = _StandInLease(d.ring.sign_many(fences), fences)
        with db.using(lease):
            assert not db.claimed
            have = db.get("accounts", a)["balance"]  # the first call claims BOTH locks
            assert db.claimed and db.highests == fences and db.highest is None
            assert (_highest(d, la), _highest(d, lb)) == (12, 13)
            db.batch(_transfer(a, b, int(Decimal(have)) + 25, 5)["ops"])
        assert _state(d, a) == (Decimal(95), 12) and _state(d, b) == (Decimal(5), 13)
        d.client.post(f"/v1/fences/{lb}/claim", headers=d.auth(lb, 14))  # a newer holder of b
        with db.using(lease), pytest.raises(StaleTokenError) as info:
            db.update("accounts", b, {"balance": 0})
        assert info.value.problem["stale"] == [{"lock": lb, "presented": 13, "highest": 14}]
        assert lease.lost and _state(d, b) == (Decimal(5), 13)


def test_async_fenced_session_with_a_multi_lock_lease(deployment: Deployment):
    d = deployment
    a, b = _accounts(d, 10, 10)
    fences = {f"accounts/{a}": 3, f"accounts/{b}": 3}
    lease = _StandInLease(d.ring.sign_many(fences), fences)

    async def transfer() -> None:
        async with AsyncFencedSession(d.url, lease) as db:  # type: ignore[arg-type]
            assert await db.claim() == fences and db.claimed
            await db.batch(_transfer(a, b, 0, 20)["ops"])

    asyncio.run(transfer())
    assert _state(d, a) == (Decimal(0), 3) and _state(d, b) == (Decimal(20), 3)
