"""Text fields of every request body (``owner``, ``value``, ``lease_id``, ``client_id``,
``target``) carry no character a store cannot keep: a NUL or another control character is 422
``invalid_request`` naming the field, on every store, before any store is asked (no 503, no
ERROR line, nothing changed). An election ``value`` may hold tab, line feed and carriage return.
Real ``lockd serve`` processes on SQLite, PostgreSQL and etcd."""

from __future__ import annotations

import pytest

from tests.server.calls import assert_problem

CLIENT_ID = "c" * 22

# (path template, body, the field holding the bad text); {n} is a name of the test's own
CASES = [
    ("/v1/locks/{n}/acquire", {"ttl_ms": 5000, "owner": "{bad}"}, "owner"),
    ("/v1/locks/{n}/acquire", {"ttl_ms": 5000, "owner": "{bad}", "mode": "shared"}, "owner"),
    ("/v1/locks/{n}/acquire", {"ttl_ms": 5000, "client_id": CLIENT_ID + "{bad}"}, "client_id"),
    ("/v1/locks/{n}/renew", {"lease_id": "{bad}"}, "lease_id"),
    ("/v1/locks/{n}/release", {"lease_id": "{bad}"}, "lease_id"),
    ("/v1/leases/acquire", {"ttl_ms": 5000, "locks": ["{n}/1", "{n}/2"], "owner": "{bad}"},
     "owner"),
    ("/v1/leases/renew", {"lease_id": "{bad}"}, "lease_id"),
    ("/v1/leases/release", {"lease_id": "{bad}"}, "lease_id"),
    ("/v1/semaphores/{n}/acquire", {"ttl_ms": 5000, "limit": 2, "owner": "{bad}"}, "owner"),
    ("/v1/semaphores/{n}/acquire", {"ttl_ms": 5000, "limit": 2,
                                    "client_id": CLIENT_ID + "{bad}"}, "client_id"),
    ("/v1/semaphores/{n}/renew", {"lease_id": "{bad}"}, "lease_id"),
    ("/v1/semaphores/{n}/release", {"lease_id": "{bad}"}, "lease_id"),
    ("/v1/elections/{n}/campaign", {"ttl_ms": 5000, "owner": "{bad}"}, "owner"),
    ("/v1/elections/{n}/campaign", {"ttl_ms": 5000, "value": "{bad}"}, "value"),
    ("/v1/elections/{n}/renew", {"lease_id": "{bad}"}, "lease_id"),
    ("/v1/elections/{n}/resign", {"lease_id": "{bad}"}, "lease_id"),
    ("/v1/elections/{n}/proclaim", {"lease_id": "{bad}", "value": "v"}, "lease_id"),
    ("/v1/elections/{n}/proclaim", {"lease_id": "x" * 32, "value": "{bad}"}, "value"),
    ("/v1/elections/{n}/handover", {"lease_id": "{bad}", "target": "next"}, "lease_id"),
    ("/v1/elections/{n}/handover", {"lease_id": "x" * 32, "target": "{bad}"}, "target"),
]


def _fill(value, name: str, bad: str):
    if isinstance(value, str):
        return value.replace("{n}", name).replace("{bad}", bad)
    if isinstance(value, list):
        return [_fill(v, name, bad) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, name, bad) for k, v in value.items()}
    return value


def test_a_nul_in_any_text_field_is_422_on_every_store(lockd, http, name):
    url = lockd.url
    for bad in ("a\x00b", "\x00"):
        for path, body, field in CASES:
            r = http.post(url + _fill(path, name, ""), json=_fill(body, name, bad))
            problem = assert_problem(r, 422, "invalid_request")
            assert field in problem["detail"], (path, field, problem)
    # nothing was granted or recorded
    assert http.get(f"{url}/v1/locks/{name}").json()["fence"] == 0
    assert http.get(f"{url}/v1/locks?prefix={name}").json()["items"] == []
    assert http.get(f"{url}/v1/semaphores/{name}").json()["fence"] == 0
    assert http.get(f"{url}/v1/elections/{name}").json()["fence"] == 0
    assert "ERROR" not in lockd.log() and "store_unavailable" not in lockd.log()
    # the same calls with clean text work
    assert http.post(f"{url}/v1/locks/{name}/acquire",
                     json={"ttl_ms": 5000, "owner": "o"}).status_code == 200
    value = "line 1\n\tline 2\r\n"
    led = http.post(f"{url}/v1/elections/{name}/e/campaign",
                    json={"ttl_ms": 5000, "owner": "o", "value": value})
    assert led.status_code == 200, led.text
    assert http.get(f"{url}/v1/elections/{name}/e").json()["value"] == value


@pytest.mark.parametrize("bad", ["\x01", "\x1b[31m", "\x7f", "\x85", "\x9b", "\n", "\t"])
def test_every_control_character_is_refused_in_labels_and_ids(lockd_factory, tmp_path, http,
                                                              name, bad):
    server = lockd_factory(f"sqlite:///{tmp_path}/lockd.db")
    for path, body, field in CASES:
        filled = _fill(body, name, f"x{bad}y")
        if field == "value" and bad in "\n\t":
            continue  # a value may hold tab and line feed
        r = http.post(server.url + _fill(path, name, ""), json=filled)
        assert field in assert_problem(r, 422, "invalid_request")["detail"], (path, field)
