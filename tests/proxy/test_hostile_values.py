"""Small, bounded, hostile values at the proxy: each is a 4xx problem naming the culprit, never a
500, and nothing is written. Run on SQLite and on PostgreSQL (``deployment``).

The classes: datetime arithmetic at the edges of ``datetime``'s range (a zone offset that moves
``0001-01-01`` or ``9999-12-31`` out of it: ``OverflowError``), text that cannot be encoded as
UTF-8 (a lone surrogate such as ``"\\ud800"``, legal in JSON text: ``UnicodeEncodeError`` in the
driver), and digits that are not ASCII (``"²"`` passes ``str.isdigit`` but not ``int``; ``"٣"``
passes both and would be an alias of ``3``).
"""

from __future__ import annotations

import json

import pytest

from tests.proxy.conftest import Deployment, assert_problem, unique, unique_id

LOW = "0001-01-01T00:00:00+01:00"  # 31 Dec of year 0 in UTC
HIGH = "9999-12-31T23:59:59-01:00"  # 1 Jan of year 10000 in UTC
SURROGATE = "\ud800"


def _raw(value) -> str:
    """JSON text of ``value`` with non-ASCII escaped (how a lone surrogate travels)."""
    return json.dumps(value, ensure_ascii=True)


def _send(d: Deployment, method: str, path: str, body, lock: str | None = None):
    """Send ``body`` as raw JSON under a token for ``lock`` (the row's lock where a write could
    succeed; a made-up one only where the request is refused before the binding is checked)."""
    headers = {**d.auth(lock or unique("hostile/"), 1), "content-type": "application/json"}
    return d.client.request(method, path, content=_raw(body), headers=headers)


@pytest.mark.parametrize(("column", "value"), [
    ("ts", LOW), ("ts", HIGH), ("ts", "0001-01-01T00:00:00+23:59"),
    ("t", SURROGATE), ("t", "ok" + "\udfff"), ("vc", "a\ud800"),
    ("j", SURROGATE), ("j", {"k": ["x", "\udc80"]}), ("j", {SURROGATE: 1}),
    ("i", "²"), ("i", "٣"), ("n", "٣"), ("f", "٣.5"), ("u", "٠" * 32),
])
def test_hostile_value_in_a_column_is_422_and_writes_nothing(deployment: Deployment, column, value):
    d, key = deployment, unique_id()
    r = _send(d, "PUT", f"/v1/tables/kinds/rows/{key}", {column: value}, f"kinds/{key}")
    assert assert_problem(r, 422, "invalid_request")["column"] == column
    assert d.db.query("SELECT count(*) FROM kinds WHERE id = ?", (key,)) == [(0,)]


def test_hostile_values_in_inserts_patches_and_batches(deployment: Deployment):
    d, key = deployment, unique()
    lock = f"items/{key}"
    assert _send(d, "PUT", f"/v1/tables/items/rows/{key}", {"v": "fine"}, lock).status_code == 200
    assert_problem(_send(d, "POST", "/v1/tables/items/rows", {"id": SURROGATE, "v": "x"}, lock),
                   422, "invalid_request")
    assert_problem(_send(d, "PATCH", f"/v1/tables/items/rows/{key}", {"v": SURROGATE}, lock),
                   422, "invalid_request")
    # op 0 is governed by the batch token's lock (a fresh row's); op 1's hostile key or value
    # is refused before its binding is checked
    fresh = unique()
    ops = [{"op": "upsert", "table": "items", "key": fresh, "row": {"v": "ok"}},
           {"op": "upsert", "table": "items", "key": SURROGATE, "row": {"v": "ok"}}]
    batch_lock = f"items/{fresh}"
    problem = assert_problem(_send(d, "POST", "/v1/batch", {"ops": ops}, batch_lock), 422,
                             "invalid_request")
    assert problem["op_index"] == 1
    ops[1] = {"op": "update", "table": "kinds", "key": 1, "row": {"ts": HIGH}}
    problem = assert_problem(_send(d, "POST", "/v1/batch", {"ops": ops}, batch_lock), 422,
                             "invalid_request")
    assert problem["op_index"] == 1 and problem["column"] == "ts"
    assert d.db.query("SELECT v FROM items WHERE id = ?", (key,)) == [("fine",)]
    assert d.db.query("SELECT count(*) FROM items WHERE id = ?", (ops[0]["key"],)) == [(0,)]


def test_a_surrogate_column_or_table_name_is_a_problem_the_renderer_can_write(deployment: Deployment):
    d = deployment
    key = unique_id()
    r = _send(d, "PUT", f"/v1/tables/kinds/rows/{key}", {SURROGATE: 1, "t": "x"}, f"kinds/{key}")
    assert assert_problem(r, 422, "invalid_request")["column"] == SURROGATE
    r = _send(d, "POST", "/v1/batch", {"ops": [{"op": "insert", "table": SURROGATE, "row": {}}]})
    assert assert_problem(r, 404, "not_found")["table"] == SURROGATE


@pytest.mark.parametrize("query", [
    "limit=%C2%B2", "limit=%D9%A3", "limit=%EF%BC%91", "limit=+5", "limit=5%20", "limit=0",
    "limit=" + "9" * 5000,
    "ts=" + LOW.replace("+", "%2B"), "ts=" + HIGH, "i=%C2%B2", "i=%D9%A3",
    "t=%ED%A0%80",  # the UTF-8 form of a surrogate: not UTF-8, so not a value
])
def test_hostile_filters_are_422(deployment: Deployment, query):
    r = deployment.client.get(f"/v1/tables/kinds/rows?{query}")
    assert_problem(r, 422, "invalid_request")


@pytest.mark.parametrize("key", ["%C2%B2", "%D9%A3", "%ED%A0%80", "%FF"])
def test_hostile_url_keys_are_422(deployment: Deployment, key):
    d = deployment
    assert_problem(d.client.get(f"/v1/tables/kinds/rows/{key}"), 422, "invalid_request")
    if key in ("%ED%A0%80", "%FF"):  # not UTF-8: not even a text key
        assert_problem(d.client.get(f"/v1/tables/items/rows/{key}"), 422, "invalid_request")
    r = d.client.put(f"/v1/tables/kinds/rows/{key}", json={"t": "x"},
                     headers=d.auth(unique("hostile/"), 1))
    assert_problem(r, 422, "invalid_request")


def test_ascii_digits_and_in_range_timestamps_still_work(deployment: Deployment):
    d, key = deployment, unique_id()
    lock = f"kinds/{key}"
    row = {"ts": "0001-01-01T00:00:00+00:00", "i": "7", "t": "emoji \U0001f600 ok"}
    r = _send(d, "PUT", f"/v1/tables/kinds/rows/{key}", row, lock)
    assert r.status_code == 200, r.text
    assert r.json()["ts"].startswith("0001-01-01T00:00:00") and r.json()["i"] == 7
    assert r.json()["t"] == row["t"]
    late = _send(d, "PATCH", f"/v1/tables/kinds/rows/{key}", {"ts": "9999-12-31T23:59:59+01:00"}, lock)
    assert late.status_code == 200, late.text
    listed = d.client.get(f"/v1/tables/kinds/rows?id={key}&limit=5")
    assert listed.status_code == 200 and len(listed.json()["items"]) == 1


@pytest.mark.parametrize("token", [b"\xb2.\xb2.\xb2", b"\xff" * 40, "²".encode("latin-1") * 3000])
def test_a_non_ascii_token_is_401_not_500(deployment: Deployment, token):
    d, key = deployment, unique()
    r = d.client.put(f"/v1/tables/items/rows/{key}", json={"v": "x"},
                     headers=[("Fencing-Token", token)])
    assert_problem(r, 401, "invalid_token")
    assert_problem(d.client.get(f"/v1/tables/items/rows/{key}", headers=[("Fencing-Token", token)]),
                   401, "invalid_token")


@pytest.mark.parametrize("number", ["1e999999", "-1e400", "1e309"])
def test_a_number_beyond_the_databases_range_is_422_not_infinity(deployment: Deployment, number):
    """SQLite's NUMERIC affinity would store it as a REAL: Infinity, silently."""
    d, key = deployment, unique_id()
    r = d.client.put(f"/v1/tables/kinds/rows/{key}", content='{"n": ' + number + "}",
                     headers={**d.auth(f"kinds/{key}", 1), "content-type": "application/json"})
    assert_problem(r, 422, "invalid_request")
    assert d.db.query("SELECT count(*) FROM kinds WHERE id = ?", (key,)) == [(0,)]
