"""The proxy's HTTP contract, run against a real ``resource-proxy serve`` process on SQLite AND
on PostgreSQL (the ``deployment`` fixture is parametrized over both).

Each test uses its own lock names and row keys, and checks the database directly: a rejected
request must leave no trace.
"""

from __future__ import annotations

import base64
import json
from decimal import Decimal
from urllib.parse import quote

import pytest

from lockd.tokens import KeyRing
from resource_proxy.canonical import encode
from tests.proxy.conftest import Deployment, assert_problem, unique, unique_id


def _balance(d: Deployment, account: int) -> list[tuple]:
    return d.db.query("SELECT balance, owner, last_fence FROM accounts WHERE id = ?", (account,))


# -- 1. the revived holder ---------------------------------------------------------------------

def test_revived_holder_is_rejected_and_leaves_no_trace(deployment: Deployment):
    d, account = deployment, unique_id()
    lock = f"accounts/{account}"
    first = d.client.put(f"/v1/tables/accounts/rows/{account}", json={"balance": "10", "owner": "h1"},
                         headers=d.auth(lock, 1))
    assert first.status_code == 200, first.text
    assert first.json()["last_fence"] == 1
    second = d.client.put(f"/v1/tables/accounts/rows/{account}", json={"balance": "20", "owner": "h2"},
                          headers=d.auth(lock, 2))
    assert second.status_code == 200, second.text
    assert (Decimal(second.json()["balance"]), second.json()["owner"]) == (Decimal(20), "h2")

    revived = d.client.put(f"/v1/tables/accounts/rows/{account}", json={"balance": "99", "owner": "h1"},
                           headers=d.auth(lock, 1))
    problem = assert_problem(revived, 409, "stale_token")
    assert (problem["lock"], problem["presented"], problem["highest"]) == (lock, 1, 2)
    for stale in (
        d.client.patch(f"/v1/tables/accounts/rows/{account}", json={"owner": "h1"}, headers=d.auth(lock, 1)),
        d.client.delete(f"/v1/tables/accounts/rows/{account}", headers=d.auth(lock, 1)),
    ):
        assert_problem(stale, 409, "stale_token")
    [(balance, owner, last_fence)] = _balance(d, account)
    assert (Decimal(str(balance)), owner, last_fence) == (Decimal(20), "h2", 2)
    assert d.client.get(f"/v1/fences/{lock}").json() == {"lock": lock, "highest": 2}


def test_equal_fence_is_the_same_holders_next_write(deployment: Deployment):
    d, key = deployment, unique()
    lock = f"items/{key}"
    for value in ("a", "b", "c"):
        r = d.client.put(f"/v1/tables/items/rows/{key}", json={"v": value}, headers=d.auth(lock, 5))
        assert r.status_code == 200, r.text
    assert d.db.query("SELECT v FROM items WHERE id = ?", (key,)) == [("c",)]


# -- row calls ---------------------------------------------------------------------------------

def test_insert_put_patch_delete_and_reads(deployment: Deployment):
    d, key = deployment, unique()
    lock = f"items/{key}"
    created = d.client.post("/v1/tables/items/rows", json={"id": key, "v": "one", "n": 1}, headers=d.auth(lock, 1))
    assert created.status_code == 201 and created.json() == {"id": key, "v": "one", "n": 1}
    duplicate = d.client.post("/v1/tables/items/rows", json={"id": key, "v": "two"}, headers=d.auth(lock, 1))
    assert_problem(duplicate, 409, "conflict")

    patched = d.client.patch(f"/v1/tables/items/rows/{key}", json={"n": 2}, headers=d.auth(lock, 1))
    assert patched.status_code == 200 and patched.json() == {"id": key, "v": "one", "n": 2}
    replaced = d.client.put(f"/v1/tables/items/rows/{key}", json={"v": "three"}, headers=d.auth(lock, 1))
    assert replaced.json() == {"id": key, "v": "three", "n": None}, "PUT replaces the whole row"

    assert d.client.get(f"/v1/tables/items/rows/{key}").json() == {"id": key, "v": "three", "n": None}
    listed = d.client.get("/v1/tables/items/rows", params={"v": "three", "id": key})
    assert listed.json() == {"items": [{"id": key, "v": "three", "n": None}]}

    deleted = d.client.delete(f"/v1/tables/items/rows/{key}", headers=d.auth(lock, 1))
    assert deleted.status_code == 204 and deleted.content == b""
    assert_problem(d.client.get(f"/v1/tables/items/rows/{key}"), 404, "not_found")
    assert_problem(d.client.delete(f"/v1/tables/items/rows/{key}", headers=d.auth(lock, 1)), 404, "not_found")
    assert_problem(d.client.patch(f"/v1/tables/items/rows/{key}", json={"v": "x"}, headers=d.auth(lock, 1)),
                   404, "not_found")
    assert d.db.query("SELECT count(*) FROM items WHERE id = ?", (key,)) == [(0,)]


def test_list_filters_limit_and_order(deployment: Deployment):
    d, tag = deployment, unique()
    keys = sorted(f"{tag}-{i}" for i in range(5))
    for i, key in enumerate(keys):
        r = d.client.put(f"/v1/tables/items/rows/{key}", json={"v": tag, "n": i % 2},
                         headers=d.auth(f"items/{key}", 1))
        assert r.status_code == 200
    rows = d.client.get("/v1/tables/items/rows", params={"v": tag}).json()["items"]
    assert [row["id"] for row in rows] == keys
    odd = d.client.get("/v1/tables/items/rows", params={"v": tag, "n": "1"}).json()["items"]
    assert [row["id"] for row in odd] == [keys[1], keys[3]]
    assert len(d.client.get("/v1/tables/items/rows", params={"v": tag, "limit": "2"}).json()["items"]) == 2
    for bad in ("0", "1001", "x", "-1"):
        assert_problem(d.client.get("/v1/tables/items/rows", params={"limit": bad}), 422, "invalid_request")
    assert_problem(d.client.get("/v1/tables/items/rows", params={"n": "one"}), 422, "invalid_request")


def test_composite_keys_in_urls_and_batches(deployment: Deployment):
    a, b = unique_id(), "x,y/z %"
    d, lock = deployment, f"pairs/{a}"  # a comma, a slash and a percent inside a key value
    path = f"/v1/tables/pairs/rows/{a},{quote(b, safe='')}"
    put = d.client.put(path, json={"v": "first"}, headers=d.auth(lock, 1))
    assert put.status_code == 200, put.text
    assert put.json() == {"a": a, "b": b, "v": "first"}
    assert d.client.get(path).json() == {"a": a, "b": b, "v": "first"}
    assert d.db.query("SELECT v FROM pairs WHERE a = ? AND b = ?", (a, b)) == [("first",)]

    batch = d.client.post("/v1/batch", headers=d.auth(lock, 1), json={"ops": [
        {"op": "update", "table": "pairs", "key": [a, b], "row": {"v": "second"}},
        {"op": "update", "table": "pairs", "key": {"b": b, "a": a}, "row": {"v": "third"}},
        {"op": "insert", "table": "pairs", "row": {"a": a, "b": "other", "v": "new"}},
    ]})
    assert batch.status_code == 200, batch.text
    assert [r["row"]["v"] for r in batch.json()["results"]] == ["second", "third", "new"]
    assert d.client.get(path).json()["v"] == "third"

    wrong_arity = d.client.get(f"/v1/tables/pairs/rows/{a}")
    assert_problem(wrong_arity, 422, "invalid_request")
    assert_problem(d.client.get(f"/v1/tables/pairs/rows/{a},{quote(b, safe='')},extra"), 422, "invalid_request")


# -- values ------------------------------------------------------------------------------------

def test_values_map_to_column_types(deployment: Deployment):
    d, key = deployment, unique_id()
    lock = f"kinds/{key}"
    row = {
        "i": "42",  # integers accept strings of digits
        "n": "12345.678901234",
        "f": 1.5,
        "t": "text with 'quotes' and \"doubles\"",
        "vc": "abc",
        "b": True,
        "ts": "2024-05-01T14:00:00+02:00",
        "d": "2024-05-01",
        "u": "6F9619FF-8B86-D011-B42D-00CF4FC964FF",
        "j": {"list": [1, "two", None], "nested": {"ok": True}},
    }
    r = d.client.put(f"/v1/tables/kinds/rows/{key}", json=row, headers=d.auth(lock, 1))
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["i"] == 42 and got["f"] == 1.5 and got["b"] is True and got["vc"] == "abc"
    assert isinstance(got["n"], str) and Decimal(got["n"]) == Decimal("12345.678901234")
    assert got["t"] == row["t"]
    assert got["ts"] == "2024-05-01T12:00:00+00:00"
    assert got["d"] == "2024-05-01"
    assert got["u"] == "6f9619ff-8b86-d011-b42d-00cf4fc964ff"
    assert got["j"] == row["j"]
    assert d.client.get(f"/v1/tables/kinds/rows/{key}").json() == got

    exact = '{"j": {"x": 0.1000000000000000055511151231257827}, "n": 1.5}'
    r = d.client.patch(f"/v1/tables/kinds/rows/{key}", content=exact,
                       headers={**d.auth(lock, 1), "content-type": "application/json"})
    assert r.status_code == 200, r.text
    assert '"x":0.1000000000000000055511151231257827' in r.text.replace(" ", ""), "JSON numbers stay exact"


def test_numeric_precision(deployment: Deployment):
    """PostgreSQL keeps every digit of a numeric (sent as a string or as a JSON number); SQLite's
    NUMERIC affinity stores a REAL, which cannot keep them: refused (422), nothing written."""
    d, key = deployment, unique_id()
    lock = f"kinds/{key}"
    value = "12345678901234567890.12345678901234567890"
    for body in ('{"n": "' + value + '"}', '{"n": ' + value + "}"):
        r = d.client.put(f"/v1/tables/kinds/rows/{key}", content=body,
                         headers={**d.auth(lock, 1), "content-type": "application/json"})
        if d.backend == "postgres":
            assert r.status_code == 200, r.text
            assert r.json()["n"] == value
        else:
            assert assert_problem(r, 422, "invalid_request")["column"] == "n"
            assert d.client.get(f"/v1/tables/kinds/rows/{key}").status_code == 404
    too_big = d.client.put(f"/v1/tables/kinds/rows/{key}", json={"i": 2**63}, headers=d.auth(lock, 1))
    assert assert_problem(too_big, 422, "invalid_request")["column"] == "i"


@pytest.mark.parametrize(("column", "value"), [
    ("i", "abc"), ("i", 1.5), ("i", True), ("i", [1]), ("i", Decimal("1e999999999")),
    ("f", Decimal("1e999")), ("n", "1e"), ("n", "NaN"), ("n", {"x": 1}),
    ("f", "fast"), ("t", 5), ("t", "nul\u0000byte"), ("vc", "abcdef"), ("b", "yes"), ("b", 1),
    ("ts", "yesterday"), ("ts", 1714567200), ("d", "2024-13-01"), ("u", "not-a-uuid"), ("u", 7),
])
def test_a_value_of_the_wrong_type_is_422_naming_the_column(deployment: Deployment, column, value):
    d, key = deployment, unique_id()
    text = str(value) if isinstance(value, Decimal) else json.dumps(value)  # Decimal: a raw number
    body = "{" + json.dumps(column) + ": " + text + "}"
    r = d.client.put(f"/v1/tables/kinds/rows/{key}", content=body,
                     headers={**d.auth(f"kinds/{key}", 1), "content-type": "application/json"})
    assert assert_problem(r, 422, "invalid_request")["column"] == column
    assert d.db.query("SELECT count(*) FROM kinds WHERE id = ?", (key,)) == [(0,)]


def test_constraint_violations(deployment: Deployment):
    d, account = deployment, unique_id()
    lock = f"accounts/{account}"
    check = d.client.put(f"/v1/tables/accounts/rows/{account}", json={"balance": -1}, headers=d.auth(lock, 1))
    assert_problem(check, 422, "invalid_request")  # CHECK: the row's own content is invalid
    missing = d.client.post("/v1/tables/history/rows", json={"fence": 1}, headers=d.auth("history", 1))
    assert assert_problem(missing, 422, "invalid_request")["column"] == "writer"  # NOT NULL
    child = unique_id()
    orphan = d.client.put(f"/v1/tables/children/rows/{child}", json={"account_id": account},
                          headers=d.auth(f"children/{child}", 1))
    assert_problem(orphan, 409, "conflict")  # FOREIGN KEY: collides with the state of other rows
    null = d.client.put(f"/v1/tables/accounts/rows/{account}", json={"balance": None}, headers=d.auth(lock, 1))
    assert assert_problem(null, 422, "invalid_request")["column"] == "balance"
    assert _balance(d, account) == []


def test_fence_column_records_the_writer_and_is_the_proxys_to_set(deployment: Deployment):
    d, account = deployment, unique_id()
    lock = f"accounts/{account}"
    assert d.client.put(f"/v1/tables/accounts/rows/{account}", json={"balance": 1}, headers=d.auth(lock, 3)).json()["last_fence"] == 3
    assert d.client.patch(f"/v1/tables/accounts/rows/{account}", json={"owner": "x"}, headers=d.auth(lock, 7)).json()["last_fence"] == 7
    forged = d.client.patch(f"/v1/tables/accounts/rows/{account}", json={"last_fence": 1000}, headers=d.auth(lock, 7))
    assert assert_problem(forged, 422, "invalid_request")["column"] == "last_fence"
    assert _balance(d, account)[0][2] == 7


# -- 3. batches --------------------------------------------------------------------------------

def _pairs(d: Deployment, a: int) -> dict[str, str]:
    return dict(d.db.query("SELECT b, v FROM pairs WHERE a = ?", (a,)))


def test_batch_applies_all_ops_in_one_transaction(deployment: Deployment):
    d, a = deployment, unique_id()
    lock = f"pairs/{a}"  # every row with this ``a`` is governed by one lock
    r = d.client.post("/v1/batch", headers=d.auth(lock, 4), json={"ops": [
        {"op": "insert", "table": "pairs", "row": {"a": a, "b": "x", "v": "100"}},
        {"op": "upsert", "table": "pairs", "key": [a, "y"], "row": {"v": "5"}},
        {"op": "update", "table": "pairs", "key": [a, "x"], "row": {"v": "60"}},
        {"op": "update", "table": "pairs", "key": {"a": a, "b": "y"}, "row": {"v": "45"}},
        {"op": "insert", "table": "audit", "row": {"v": lock}},  # unfenced: rides along
        {"op": "delete", "table": "pairs", "key": [a, "y"]},
    ]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["lock"], body["fence"]) == (lock, 4)
    assert [(x["op"], x["table"]) for x in body["results"]] == [
        ("insert", "pairs"), ("upsert", "pairs"), ("update", "pairs"), ("update", "pairs"),
        ("insert", "audit"), ("delete", "pairs")]
    assert body["results"][-1]["row"] is None and body["results"][2]["row"]["v"] == "60"
    assert _pairs(d, a) == {"x": "60"}
    assert d.db.query("SELECT count(*) FROM audit WHERE v = ?", (lock,)) == [(1,)]


def test_stale_batch_applies_nothing(deployment: Deployment):
    d, a = deployment, unique_id()
    lock = f"pairs/{a}"
    assert d.client.post(f"/v1/fences/{lock}/claim", headers=d.auth(lock, 2)).json()["highest"] == 2
    r = d.client.post("/v1/batch", headers=d.auth(lock, 1), json={"ops": [
        {"op": "insert", "table": "pairs", "row": {"a": a, "b": "1", "v": "x"}},
        {"op": "insert", "table": "pairs", "row": {"a": a, "b": "2", "v": "x"}},
        {"op": "insert", "table": "audit", "row": {"v": lock}},
    ]})
    problem = assert_problem(r, 409, "stale_token")
    assert (problem["presented"], problem["highest"], problem["op_index"]) == (1, 2, 0)
    assert _pairs(d, a) == {}
    assert d.db.query("SELECT count(*) FROM audit WHERE v = ?", (lock,)) == [(0,)]


@pytest.mark.parametrize(("bad_op", "status", "code"), [
    ({"op": "insert", "table": "pairs", "row": {"a": "{a}", "b": "dup"}}, 409, "conflict"),
    ({"op": "upsert", "table": "pairs", "key": ["{a}", "new"], "row": {"nope": 1}}, 422, "invalid_request"),
    ({"op": "update", "table": "pairs", "key": ["{a}", "absent"], "row": {"v": "1"}}, 404, "not_found"),
    ({"op": "insert", "table": "secrets", "row": {"id": 1}}, 404, "not_found"),
    ({"op": "explode", "table": "pairs", "key": ["{a}", "new"]}, 422, "invalid_request"),
    ({"op": "upsert", "table": "pairs", "key": ["{other}", "new"], "row": {"v": "1"}}, 403, "lock_not_allowed"),
    ({"op": "upsert", "table": "accounts", "key": "{other}", "row": {"balance": 1}}, 403, "lock_not_allowed"),
])
def test_one_failing_op_rejects_the_whole_batch(deployment: Deployment, bad_op, status, code):
    d, a, other = deployment, unique_id(), unique_id()
    lock = f"pairs/{a}"
    assert d.client.put(f"/v1/tables/pairs/rows/{a},dup", json={"v": "7"}, headers=d.auth(lock, 1)).status_code == 200
    filled = json.loads(json.dumps(bad_op).replace('"{a}"', str(a)).replace('"{other}"', str(other)))
    r = d.client.post("/v1/batch", headers=d.auth(lock, 1), json={"ops": [
        {"op": "insert", "table": "pairs", "row": {"a": a, "b": "first", "v": "1"}},
        {"op": "update", "table": "pairs", "key": [a, "dup"], "row": {"v": "8"}},
        filled,
    ]})
    problem = assert_problem(r, status, code)
    assert problem["op_index"] == 2
    if status == 403:
        assert problem["lock"] in (f"pairs/{other}", f"accounts/{other}")
    assert _pairs(d, a) == {"dup": "7"}, "an op of the rejected batch was applied"
    assert _pairs(d, other) == {}


@pytest.mark.parametrize("body", [
    {}, {"ops": []}, {"ops": "x"}, {"ops": [1]}, {"ops": [{"op": "insert"}]}, [], "ops", None,
    {"ops": [{"op": "insert", "table": "items", "row": {"id": "x"}, "extra": 1}]},
    {"ops": [{"op": "update", "table": "items", "row": {"v": "x"}}]},
    {"ops": [{"op": "delete", "table": "pairs", "key": [1]}]},
    {"ops": [{"op": "delete", "table": "pairs", "key": {"a": 1}}]},
    {"ops": [{"op": "delete", "table": "items", "key": {"x": [1, 2]}}]},
])
def test_malformed_batches_are_422(deployment: Deployment, body):
    d = deployment
    r = d.client.post("/v1/batch", json=body, headers=d.auth(unique("b/"), 1))
    assert_problem(r, 422, "invalid_request")


# -- 4. tokens and policy ----------------------------------------------------------------------

def _altered_fence(token: str, fence: int) -> str:
    header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["fence"] = fence
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"{header}.{forged}.{signature}"


def test_tokens_missing_forged_or_unknown(deployment: Deployment):
    d, key = deployment, unique()
    lock = unique("tok/")
    path = f"/v1/tables/items/rows/{key}"
    assert_problem(d.client.put(path, json={"v": "x"}), 428, "token_required")
    assert_problem(d.client.post("/v1/batch", json={"ops": [
        {"op": "upsert", "table": "items", "key": key, "row": {"v": "x"}}]}), 428, "token_required")
    assert_problem(d.client.post(f"/v1/fences/{lock}/claim"), 428, "token_required")

    good = d.token(lock, 1)
    head, payload, sig = good.split(".")
    bad_signature = f"{head}.{payload}.{sig[:-4]}{'AAAA' if sig[-4:] != 'AAAA' else 'BBBB'}"
    for token in (
        bad_signature,
        KeyRing.generate().sign(lock, 1),  # a key lockd never published
        _altered_fence(good, 10**9),  # a client inventing a huge fence
        "not-a-token",
        "a.b.c",
        "",
    ):
        r = d.client.put(path, json={"v": "x"}, headers={"Fencing-Token": token})
        assert_problem(r, 428 if token == "" else 401, "token_required" if token == "" else "invalid_token")
    assert d.db.query("SELECT count(*) FROM items WHERE id = ?", (key,)) == [(0,)]
    assert d.client.get(f"/v1/fences/{lock}").json()["highest"] == 0, "a forged fence must not count"
    assert_problem(d.client.get(path, headers={"Fencing-Token": bad_signature}), 401, "invalid_token")


def test_each_row_is_written_under_its_one_lock_only(deployment: Deployment):
    d, seven, eight = deployment, unique_id(), unique_id()
    lock = f"accounts/{seven}"
    assert d.client.put(f"/v1/tables/accounts/rows/{seven}", json={"balance": 1}, headers=d.auth(lock, 1)).status_code == 200
    other_row = d.client.put(f"/v1/tables/accounts/rows/{eight}", json={"balance": 1}, headers=d.auth(lock, 9))
    problem = assert_problem(other_row, 403, "lock_not_allowed")
    assert (problem["lock"], problem["token_lock"]) == (f"accounts/{eight}", lock)
    assert f"is written under lock 'accounts/{eight}'" in problem["detail"]
    inserted = d.client.post("/v1/tables/accounts/rows", json={"id": eight, "balance": 1}, headers=d.auth(lock, 9))
    assert_problem(inserted, 403, "lock_not_allowed")
    foreign = d.client.patch(f"/v1/tables/accounts/rows/{seven}", json={"balance": 2}, headers=d.auth("items/1", 9))
    assert assert_problem(foreign, 403, "lock_not_allowed")["lock"] == lock
    batch = d.client.post("/v1/batch", headers=d.auth(lock, 9), json={"ops": [
        {"op": "update", "table": "accounts", "key": seven, "row": {"balance": 3}},
        {"op": "update", "table": "accounts", "key": eight, "row": {"balance": 3}},
    ]})
    assert assert_problem(batch, 403, "lock_not_allowed")["op_index"] == 1
    read = d.client.get(f"/v1/tables/accounts/rows/{seven}", headers=d.auth(f"accounts/{eight}", 9))
    assert assert_problem(read, 403, "lock_not_allowed")["lock"] == lock
    unpinned = d.client.get("/v1/tables/accounts/rows", params={"owner": "x"}, headers=d.auth(lock, 9))
    assert_problem(unpinned, 422, "invalid_request")  # a fenced list must pin the lock's key
    pinned = d.client.get("/v1/tables/accounts/rows", params={"id": seven}, headers=d.auth(lock, 1))
    assert pinned.status_code == 200 and len(pinned.json()["items"]) == 1
    claim_other = d.client.post(f"/v1/fences/accounts/{eight}/claim", headers=d.auth(lock, 9))
    assert_problem(claim_other, 403, "lock_not_allowed")
    for nobody in ("bank/x", f"accounts/0{seven}", "accounts"):  # governs no row of any table
        assert_problem(d.client.post(f"/v1/fences/{nobody}/claim", headers=d.auth(nobody, 9)),
                       403, "lock_not_allowed")
    [(balance, _, last_fence)] = _balance(d, seven)
    assert (Decimal(str(balance)), last_fence) == (1, 1) and _balance(d, eight) == []
    assert d.client.get(f"/v1/fences/{lock}").json()["highest"] == 1, "no refused call raised it"


def test_the_proxy_names_the_lock_of_a_row(deployment: Deployment):
    d = deployment
    b = "x,y/z %é"
    cases = [("accounts", "007", "accounts/7"), ("items", quote("a b/c", safe=""), "items/a:20b:2Fc"),
             ("pairs", f"5,{quote(b, safe='')}", "pairs/5"), ("history", None, "history"),
             ("kinds", "+12", "kinds/12")]
    for table, key, lock in cases:
        query = f"?key={key}" if key is not None else ""
        r = d.client.get(f"/v1/tables/{table}/lock{query}")
        assert r.status_code == 200, r.text
        assert (r.json()["table"], r.json()["lock"], r.json()["unfenced"]) == (table, lock, False)
    assert d.client.get("/v1/tables/audit/lock").json() == {
        "table": "audit", "lock": None, "template": None, "unfenced": True}
    assert_problem(d.client.get("/v1/tables/accounts/lock"), 422, "invalid_request")
    assert_problem(d.client.get("/v1/tables/accounts/lock?key=x"), 422, "invalid_request")
    assert_problem(d.client.get("/v1/tables/secrets/lock?key=1"), 404, "not_found")
    listed = {t["table"]: t for t in d.client.get("/v1/tables").json()["items"]}
    assert listed["accounts"]["lock"] == "accounts/{key}" and listed["audit"]["unfenced"] is True


def test_an_unfenced_table_is_written_without_a_token_only_when_declared(deployment: Deployment):
    d = deployment
    r = d.client.post("/v1/tables/audit/rows", json={"v": "no token"})
    assert r.status_code == 201, r.text
    assert d.client.patch(f"/v1/tables/audit/rows/{r.json()['id']}", json={"v": "still none"}).status_code == 200
    assert_problem(d.client.post("/v1/tables/audit/rows", json={"v": "x"},
                                 headers={"Fencing-Token": "forged"}), 401, "invalid_token")
    assert_problem(d.client.put(f"/v1/tables/items/rows/{unique()}", json={"v": "x"}), 428, "token_required")
    assert_problem(d.client.post("/v1/batch", json={"ops": [
        {"op": "insert", "table": "audit", "row": {"v": "x"}},
        {"op": "upsert", "table": "items", "key": unique(), "row": {"v": "x"}}]}), 428, "token_required")


# -- 5. allow-list and injection ---------------------------------------------------------------

def _snapshot(d: Deployment) -> dict[str, int]:
    return {t: d.db.query(f"SELECT count(*) FROM {t}")[0][0]
            for t in ("accounts", "items", "pairs", "kinds", "history", "children", "secrets")}


def test_tables_outside_the_allow_list_are_404(deployment: Deployment):
    d, lock = deployment, unique("x/")
    own = "resource_proxy_fences" if d.backend == "sqlite" else "fencing.fences"
    for table in ("secrets", own, "fences", "nope", "pg_class", "sqlite_master"):
        path = f"/v1/tables/{quote(table, safe='')}/rows"
        assert_problem(d.client.post(path, json={"id": 1}, headers=d.auth(lock, 1)), 404, "not_found")
        assert_problem(d.client.get(path), 404, "not_found")
        assert_problem(d.client.get(f"{path}/1"), 404, "not_found")


def test_injection_shaped_names_and_keys_change_nothing(deployment: Deployment):
    d, victim = deployment, unique()
    lock = f"items/{victim}"
    assert d.client.put(f"/v1/tables/items/rows/{victim}", json={"v": "safe"}, headers=d.auth(lock, 1)).status_code == 200
    before = _snapshot(d)
    auth = d.auth(lock, 1)
    evil_tables = ['items; DROP TABLE items; --', 'items"', 'items" WHERE 1=1 --', "items'--", "../items"]
    for table in evil_tables:
        path = f"/v1/tables/{quote(table, safe='')}/rows"
        assert_problem(d.client.post(path, json={"id": "x"}, headers=auth), 404, "not_found")
        assert_problem(d.client.delete(f"{path}/{victim}", headers=auth), 404, "not_found")
    evil_columns = ['v" = \'pwned\' --', "v; DROP TABLE items", "id) VALUES ('x'); --", "*"]
    for column in evil_columns:
        r = d.client.patch(f"/v1/tables/items/rows/{victim}", json={column: "pwned"}, headers=auth)
        assert assert_problem(r, 422, "invalid_request")["column"] == column
        assert_problem(d.client.get("/v1/tables/items/rows", params={column: "x"}), 422, "invalid_request")
    for key in ("x' OR '1'='1", "x'; DROP TABLE items; --", '" OR ""="', "%' OR 1=1 --"):
        path = f"/v1/tables/items/rows/{quote(key, safe='')}"
        own = d.auth("items/" + encode(key), 1)
        assert_problem(d.client.patch(path, json={"v": "pwned"}, headers=auth), 403, "lock_not_allowed")
        assert_problem(d.client.patch(path, json={"v": "pwned"}, headers=own), 404, "not_found")
        assert_problem(d.client.delete(path, headers=own), 404, "not_found")
        assert_problem(d.client.get(path), 404, "not_found")
        assert d.client.get("/v1/tables/items/rows", params={"v": key}).json() == {"items": []}
    for key in ("1 OR 1=1", "1; DROP TABLE accounts", "1)--"):
        r = d.client.delete(f"/v1/tables/accounts/rows/{quote(key, safe='')}", headers=d.auth("bank/x", 1))
        assert_problem(r, 422, "invalid_request")
    assert _snapshot(d) == before
    assert d.db.query("SELECT v FROM items WHERE id = ?", (victim,)) == [("safe",)]


# -- 6. claim before read (invariant 7) --------------------------------------------------------

def test_claim_fences_off_the_previous_holder_without_writing(deployment: Deployment):
    d, key = deployment, unique()
    lock = f"items/{key}"
    path = f"/v1/tables/items/rows/{key}"
    assert d.client.put(path, json={"v": "by-1"}, headers=d.auth(lock, 1)).status_code == 200
    claimed = d.client.post(f"/v1/fences/{lock}/claim", headers=d.auth(lock, 2))
    assert claimed.status_code == 200 and claimed.json() == {"lock": lock, "highest": 2}
    assert d.db.query("SELECT v FROM items WHERE id = ?", (key,)) == [("by-1",)], "a claim writes no data"
    late = d.client.put(path, json={"v": "lost-update"}, headers=d.auth(lock, 1))
    assert (assert_problem(late, 409, "stale_token")["highest"]) == 2
    assert d.db.query("SELECT v FROM items WHERE id = ?", (key,)) == [("by-1",)]
    assert_problem(d.client.post(f"/v1/fences/{lock}/claim", headers=d.auth(lock, 1)), 409, "stale_token")
    assert d.client.post(f"/v1/fences/{lock}/claim", headers=d.auth(lock, 2)).json()["highest"] == 2


def test_a_fenced_read_claims_like_a_write(deployment: Deployment):
    d, key = deployment, unique()
    lock = f"items/{key}"
    path = f"/v1/tables/items/rows/{key}"
    assert d.client.put(path, json={"v": "by-1"}, headers=d.auth(lock, 1)).status_code == 200
    read = d.client.get(path, headers=d.auth(lock, 2))
    assert read.status_code == 200 and read.json()["v"] == "by-1"
    assert d.client.get(f"/v1/fences/{lock}").json()["highest"] == 2
    assert_problem(d.client.patch(path, json={"v": "lost"}, headers=d.auth(lock, 1)), 409, "stale_token")
    listed = d.client.get("/v1/tables/items/rows", params={"id": key}, headers=d.auth(lock, 3))
    assert listed.json()["items"][0]["v"] == "by-1"
    stale_read = d.client.get(path, headers=d.auth(lock, 2))
    assert assert_problem(stale_read, 409, "stale_token")["highest"] == 3
    assert d.db.query("SELECT v FROM items WHERE id = ?", (key,)) == [("by-1",)]


def test_fence_endpoint(deployment: Deployment):
    d, lock = deployment, f"items/{unique()}"
    assert d.client.get(f"/v1/fences/{lock}").json() == {"lock": lock, "highest": 0}
    d.client.post(f"/v1/fences/{lock}/claim", headers=d.auth(lock, 9))
    assert d.client.get(f"/v1/fences/{lock}").json() == {"lock": lock, "highest": 9}
    assert_problem(d.client.get("/v1/fences/bad%20name!"), 422, "invalid_request")
    assert_problem(d.client.get("/v1/fences/" + "x" * 256), 422, "invalid_request")


# -- bad HTTP ----------------------------------------------------------------------------------

def test_bad_bodies_and_routes_are_problems_not_500s(deployment: Deployment):
    d, lock = deployment, unique("http/")
    auth = {**d.auth(lock, 1), "content-type": "application/json"}
    path = f"/v1/tables/items/rows/{unique()}"
    for body in (b"{", b"[1,2]", b'"text"', b"null", b'{"v": NaN}', b'{"v": Infinity}', b"\xff\xfe",
                 b'{"v": ' * 5000, b'{"v": 1' + b"0" * 5000 + b"}"):
        assert_problem(d.client.put(path, content=body, headers=auth), 422, "invalid_request")
    big = b'{"v": "' + b"x" * (1024 * 1024 + 10) + b'"}'
    assert_problem(d.client.put(path, content=big, headers=auth), 413, "payload_too_large")
    assert_problem(d.client.post("/v1/batch", content=big, headers=auth), 413, "payload_too_large")
    assert_problem(d.client.get("/v1/nothing-here"), 404, "not_found")
    assert_problem(d.client.post("/healthz"), 405, "method_not_allowed")
    assert_problem(d.client.patch("/v1/tables/items/rows", json={}, headers=auth), 405, "method_not_allowed")
    assert_problem(d.client.patch(path, json={}, headers=auth), 422, "invalid_request")
    assert d.client.get("/healthz").json() == {"status": "ok", "jwks": "ok", "server": "resource-proxy"}
    metrics = d.client.get("/metrics")
    assert metrics.status_code == 200 and "resource_proxy_requests_total" in metrics.text
