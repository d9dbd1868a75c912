"""SQLite numerics: a NUMERIC column on SQLite keeps a 64-bit integer or a double, so
a value neither holds exactly is refused with 422 and nothing is written, instead of being
stored rounded ("12345678901234567.89" used to come back "12345678901234568")."""

from __future__ import annotations

import httpx

from lockd.tokens import KeyRing
from tests.proxy.conftest import assert_problem, make_database, write_jwks


def test_sqlite_numeric_is_exact_or_refused(tmp_path, start_proxy):
    ring = KeyRing.generate()
    db = make_database("sqlite", tmp_path, None)
    url, _ = start_proxy(db.url, "--jwks-file", str(write_jwks(tmp_path, ring)),
                         "--tables", "kinds")
    fenced = {"Fencing-Token": ring.sign("kinds", 1)}  # no policy: table kinds, lock kinds
    with httpx.Client(base_url=url, headers=fenced) as client:
        def put(row_id: int, n) -> httpx.Response:
            return client.put(f"/v1/tables/kinds/rows/{row_id}", json={"n": n},
                              headers={"Content-Type": "application/json"})

        kept = {1: ("0.1", "0.1"), 2: ("123.456", "123.456"), 3: ("5.00", "5"),
                4: ("-9223372036854775808", "-9223372036854775808"), 5: (2.5, "2.5")}
        for row_id, (sent, back) in kept.items():
            assert put(row_id, sent).status_code == 200, (sent, put(row_id, sent).text)
            assert client.get(f"/v1/tables/kinds/rows/{row_id}").json()["n"] == back, sent
        for row_id, sent in enumerate(["12345678901234567.89", "9223372036854775808",
                                       "0.12345678901234567891"], start=10):
            problem = assert_problem(put(row_id, sent), 422, "invalid_request")
            assert problem["column"] == "n"
            assert problem["detail"].startswith(
                f"column 'n': {sent} cannot be stored exactly by SQLite"), problem
        big = client.put("/v1/tables/kinds/rows/20", content=b'{"n": 1e400}',
                         headers={"Content-Type": "application/json"})
        assert_problem(big, 422, "invalid_request")
    assert db.query("SELECT id FROM kinds WHERE id >= 10") == [], "nothing refused was written"
