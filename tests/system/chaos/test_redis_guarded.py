"""``chaos.redisguarded``, the service of ``--via redis-guard``: the counter workload's routes,
each write ONE call of the guard's Redis functions (loaded under the run's own names) appending
to a stream the checker's history is read from; a stale write appends nothing; the run's keys
and library are dropped afterwards. Against the machine's real Redis."""

from __future__ import annotations

import uuid

import pytest
from fastapi.testclient import TestClient

from chaos.redisguarded import RedisHistory, create_app, run_library
from lockd.guard import FenceGuard
from lockd.tokens import KeyRing
from tests.conftest import require
from tests.guard.conftest import REDIS_URL, redis_reason

LOCK = "chaos/counter"


@pytest.fixture
def service():
    require(redis_reason(), "Redis 7")
    import redis

    ring = KeyRing.generate()
    tag = f"t_{uuid.uuid4().hex[:10]}"
    name, text = run_library(tag)
    client = redis.Redis.from_url(REDIS_URL)
    client.function_load(text, replace=True)
    history = RedisHistory(client, f"{tag}:")
    app = create_app(FenceGuard(jwks=ring.jwks()), REDIS_URL, f"{tag}:", tag, LOCK)
    with TestClient(app) as http:
        yield http, ring, history, client, name
    history.drop(name)
    client.close()


def _token(ring: KeyRing, fence: int) -> dict[str, str]:
    return {"Fencing-Token": ring.sign(LOCK, fence)}


def test_the_run_library_has_its_own_names_only():
    name, text = run_library("abc")
    assert name == "lockd_guard_abc" and "name=lockd_guard_abc" in text
    assert "register_function('lockd_fenced_xadd_abc'" in text
    assert "register_function('lockd_fenced_xadd'" not in text
    with pytest.raises(ValueError):
        run_library("a b")


def test_writes_land_as_history_rows_and_a_stale_one_appends_nothing(service):
    http, ring, history, _client, _name = service
    row = {"value": 1, "op": "w1.0.1", "worker": "w1", "fence": 5, "read_value": 0}
    batch = {"ops": [{"op": "update", "table": "counter", "key": 1, "row": row},
                     {"op": "insert", "table": "marks",
                      "row": {"id": "w1.0.1", "worker": "w1", "fence": 5}}]}
    assert http.get("/v1/tables/counter/rows/1", headers=_token(ring, 5)).json()["value"] == 0
    assert http.post("/v1/batch", json=batch, headers=_token(ring, 5)).status_code == 200
    stale = {**row, "value": 2, "op": "w2.0.1", "worker": "w2", "fence": 4, "read_value": 1}
    refused = http.patch("/v1/tables/counter/rows/1", json=stale, headers=_token(ring, 4))
    assert refused.status_code == 409 and refused.json()["code"] == "stale_token"
    assert (refused.json()["presented"], refused.json()["highest"]) == (4, 5)
    gone = http.delete("/v1/tables/marks/rows/w1.0.1", headers=_token(ring, 6))
    assert gone.status_code == 204
    assert http.delete("/v1/tables/marks/rows/w1.0.1", headers=_token(ring, 6)).status_code == 404
    assert http.get("/v1/tables/counter/rows/1").json()["op"] == "w1.0.1"
    counter, rows = history.final_state()
    assert counter == 1
    assert [(r.kind, r.op, r.fence, r.read, r.wrote, r.seq) for r in rows] == [
        ("fence", "", 5, 0, 0, 1),  # the fenced read's claim
        ("counter", "w1.0.1", 5, 0, 1, 2), ("mark_ins", "w1.0.1", 5, 0, 0, 2),
        ("fence", "", 5, 0, 0, 2), ("mark_del", "w1.0.1", 0, 0, 0, 3), ("fence", "", 6, 0, 0, 3)]


def test_drop_removes_the_runs_keys_and_library(service):
    http, ring, history, client, name = service
    claimed = http.post(f"/v1/fences/{LOCK}/claim", headers=_token(ring, 3))
    assert claimed.json() == {"lock": LOCK, "highest": 3}
    assert list(client.scan_iter(match=history.prefix + "*"))
    history.drop(name)
    assert not list(client.scan_iter(match=history.prefix + "*"))
    assert not client.function_list(library=name)
