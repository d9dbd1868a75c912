"""API keys on lockd and the proxy (401 without or with a wrong key, 403 for a client key on the
admin call), request ids, header bounds, and logs that never contain a lease id or a token:
every lease id and token the run obtained is searched for in the servers' log files."""

from __future__ import annotations

import json
import subprocess

import httpx
import pytest

from harness import VENV_BIN, wait_for
from lockd.client import LockClient
from lockd.client.errors import PermissionDenied
from lockd.client.fenced import FencedSession
from lockd.common.keys import KeySet
from lockd.common.logs import redact
from tests.system.ops.conftest import scrape

CLIENT_KEY = "client-key-Zq81xk2PmuT"
ADMIN_KEY = "admin-key-N3vr4Jw0bcQe"
PROXY_KEY = "proxy-key-Hh5t9LmsA0p"


@pytest.fixture
def secured(start_lockd, start_proxy, tmp_path):
    admin_file = tmp_path / "admin.keys"
    admin_file.write_text(f"# operators\n{ADMIN_KEY}\n")
    lockd = start_lockd("sqlite", env={"LOCKD_API_KEYS": CLIENT_KEY,
                                       "LOCKD_ADMIN_KEYS_FILE": str(admin_file),
                                       "LOCKD_LOG_FORMAT": "json"},
                        args=("--log-level", "debug"))
    proxy = start_proxy(lockd, env={"PROXY_API_KEYS": PROXY_KEY, "PROXY_LOG_FORMAT": "json",
                                    "PROXY_LOG_LEVEL": "debug"})
    return lockd, proxy


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _problem(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["code"] == code and body["status"] == status
    return body


def test_lockd_keys(secured, name):
    lockd, _ = secured
    url = f"{lockd.url}/v1/locks/{name}"
    for response in (httpx.post(url + "/acquire", json={"ttl_ms": 1000}),
                     httpx.get(url), httpx.get(f"{lockd.url}/v1/locks"),
                     httpx.get(f"{lockd.url}/v1/events")):
        _problem(response, 401, "unauthorized")
        assert response.headers["www-authenticate"].startswith("Bearer")
    wrong = httpx.post(url + "/acquire", json={"ttl_ms": 1000}, headers=_auth("not-the-key-1"))
    _problem(wrong, 401, "unauthorized")
    assert "not valid" in wrong.json()["detail"]
    basic = httpx.get(url, headers={"Authorization": "Basic " + CLIENT_KEY})
    _problem(basic, 401, "unauthorized")
    for open_path in ("/healthz", "/metrics", "/"):  # probes, Prometheus, the page: no key
        assert httpx.get(lockd.url + open_path).status_code == 200
    lease = httpx.post(url + "/acquire", json={"ttl_ms": 30_000}, headers=_auth(CLIENT_KEY))
    assert lease.status_code == 200
    assert httpx.get(url, headers=_auth(ADMIN_KEY)).status_code == 200  # admin ⊇ client

    force = url + "/force-release"
    _problem(httpx.post(force), 401, "unauthorized")
    _problem(httpx.post(force, headers=_auth("not-the-key-1")), 401, "unauthorized")
    _problem(httpx.post(force, headers=_auth(CLIENT_KEY)), 403, "forbidden")
    assert httpx.get(url, headers=_auth(CLIENT_KEY)).json()["held"] is True  # nothing freed
    freed = httpx.post(force, headers=_auth(ADMIN_KEY))
    assert freed.status_code == 200 and freed.json()["fence"] == lease.json()["fence"]
    again = httpx.post(url + "/acquire", json={"ttl_ms": 1000}, headers=_auth(CLIENT_KEY))
    assert again.json()["fence"] > lease.json()["fence"]

    metrics = scrape(lockd.url)
    assert metrics.value("lockd_auth_failures_total", reason="missing") == 6  # Basic: no Bearer
    assert metrics.value("lockd_auth_failures_total", reason="wrong") == 2
    assert metrics.value("lockd_auth_failures_total", reason="forbidden") == 1


def test_admin_call_disabled_without_admin_keys(start_lockd, name):
    lockd = start_lockd("sqlite", env={"LOCKD_API_KEYS": CLIENT_KEY})
    body = _problem(httpx.post(f"{lockd.url}/v1/locks/{name}/force-release",
                               headers=_auth(CLIENT_KEY)), 403, "forbidden")
    assert "no admin key is configured" in body["detail"]


def test_clients_send_keys(secured):
    name = "items/k"  # the lock of row k (policy items/{key})
    lockd, proxy = secured
    with LockClient(lockd.url) as anonymous, pytest.raises(PermissionDenied) as denied:
        anonymous.status(name)
    assert denied.value.status == 401
    with LockClient(lockd.url, api_key=CLIENT_KEY) as client:
        with client.lock(name, ttl=5) as lease:
            assert client.status(name).held
            with FencedSession(proxy.url, lease, api_key=PROXY_KEY) as session:
                assert session.upsert("items", "k", {"id": "k", "v": "x"})["v"] == "x"
            with FencedSession(proxy.url, lease) as no_key, pytest.raises(PermissionDenied):
                no_key.get("items", "k")
    lockctl = str(VENV_BIN / "lockctl")
    ok = subprocess.run([lockctl, "--url", lockd.url, "status", name], capture_output=True,
                        text=True, env={"LOCKD_API_KEY": CLIENT_KEY, "PATH": "/usr/bin:/bin"})
    assert ok.returncode == 0, ok.stderr
    flag = subprocess.run([lockctl, "--url", lockd.url, "--api-key", CLIENT_KEY, "ls"],
                          capture_output=True, text=True)
    assert flag.returncode == 0 and name in flag.stdout
    refused = subprocess.run([lockctl, "--url", lockd.url, "status", name], capture_output=True,
                             text=True, env={"PATH": "/usr/bin:/bin"})
    assert refused.returncode == 1 and "401" in refused.stderr


def test_proxy_keys(secured):
    name = "items/a"  # the lock of row a
    lockd, proxy = secured
    lease = httpx.post(f"{lockd.url}/v1/locks/{name}/acquire", json={"ttl_ms": 5000},
                       headers=_auth(CLIENT_KEY)).json()
    row = f"{proxy.url}/v1/tables/items/rows/a"
    token = {"Fencing-Token": lease["token"]}
    _problem(httpx.put(row, json={"id": "a"}, headers=token), 401, "unauthorized")
    _problem(httpx.put(row, json={"id": "a"}, headers={**token, **_auth("wrong-key-123")}),
             401, "unauthorized")
    _problem(httpx.get(f"{proxy.url}/v1/activity"), 401, "unauthorized")
    assert httpx.put(row, json={"id": "a"}, headers={**token, **_auth(PROXY_KEY)}).status_code == 200
    for open_path in ("/healthz", "/metrics", "/", "/openapi.json"):
        assert httpx.get(proxy.url + open_path).status_code == 200
    metrics = scrape(proxy.url)
    assert metrics.value("resource_proxy_auth_failures_total", reason="missing") == 2
    assert metrics.value("resource_proxy_auth_failures_total", reason="wrong") == 1


def test_request_ids_and_header_bound(secured, name):
    lockd, proxy = secured
    response = httpx.get(f"{lockd.url}/v1/locks/{name}",
                         headers={**_auth(CLIENT_KEY), "X-Request-Id": "trace-42.a:b"})
    assert response.headers["x-request-id"] == "trace-42.a:b"
    made = httpx.get(f"{lockd.url}/healthz", headers={"X-Request-Id": "no spaces allowed"})
    assert made.headers["x-request-id"] != "no spaces allowed"
    assert len(made.headers["x-request-id"]) == 24
    assert httpx.get(proxy.url + "/healthz").headers["x-request-id"]
    huge = {**_auth(CLIENT_KEY), "X-Padding": "x" * 20_000}
    _problem(httpx.get(f"{lockd.url}/v1/locks/{name}", headers=huge), 431, "headers_too_large")
    _problem(httpx.get(f"{proxy.url}/v1/fences/{name}", headers={**_auth(PROXY_KEY), **huge}),
             431, "headers_too_large")
    long_token = {**_auth(PROXY_KEY), "Fencing-Token": "e" * 5000}
    _problem(httpx.post(f"{proxy.url}/v1/fences/{name}/claim", headers=long_token), 401,
             "invalid_token")
    lockd.stop()
    lines = [json.loads(line) for line in lockd.log().splitlines() if line.startswith("{")]
    traced = [line for line in lines if line.get("request_id") == "trace-42.a:b"]
    assert traced and f"GET /v1/locks/{name} -> 200" in traced[0]["msg"]


def test_no_lease_id_or_token_in_logs(secured):
    """Everything a client can do with secrets in hand, at DEBUG level with JSON logs; then
    every lease id and token obtained is searched for in both servers' log files."""
    name = "items/r"  # the lock of row r; rows c and d are items/c and items/d
    lockd, proxy = secured
    secrets: list[str] = []
    with httpx.Client(timeout=10, headers=_auth(CLIENT_KEY)) as http:
        def acquire(lock: str, ttl_ms: int, **extra) -> dict:
            lease = http.post(f"{lockd.url}/v1/locks/{lock}/acquire",
                              json={"ttl_ms": ttl_ms, **extra}).json()
            secrets.extend((lease["lease_id"], lease["token"]))
            return lease

        # 5 s: outlives the two writes on a loaded machine; the renewal below shortens it
        old = acquire(name, 5000, owner="first", client_id="c-1-Xo4TqQ8pLmW2vZr9aBcD")
        row = f"{proxy.url}/v1/tables/items/rows/r"
        proxied = {**_auth(PROXY_KEY)}
        assert httpx.put(row, json={"id": "r", "v": 1},
                         headers={**proxied, "Fencing-Token": old["token"]}).status_code == 422
        assert httpx.put(row, json={"id": "r", "v": "1"},
                         headers={**proxied, "Fencing-Token": old["token"]}).status_code == 200
        renewed = http.post(f"{lockd.url}/v1/locks/{name}/renew",
                            json={"lease_id": old["lease_id"], "ttl_ms": 300})
        assert renewed.status_code == 200
        wait_for(lambda: not http.get(f"{lockd.url}/v1/locks/{name}").json()["held"], timeout=5,
                 what="the 300 ms renewal to lapse")
        assert http.post(f"{lockd.url}/v1/locks/{name}/renew",
                         json={"lease_id": old["lease_id"]}).status_code == 410
        assert http.post(f"{lockd.url}/v1/locks/{name}/release",
                         json={"lease_id": old["lease_id"]}).status_code == 410
        bad = http.post(f"{lockd.url}/v1/locks/{name}/release",
                        json={"lease_id": old["lease_id"], "extra": old["token"]})
        assert bad.status_code == 422 and old["lease_id"] not in bad.text
        new = acquire(name, 5000)
        assert httpx.put(row, json={"id": "r", "v": "2"},
                         headers={**proxied, "Fencing-Token": new["token"]}).status_code == 200
        with LockClient(lockd.url, api_key=CLIENT_KEY) as client:
            lease = client.acquire("items/c", 5, auto_renew=False)
            secrets.extend((lease.lease_id, lease.token))
            with FencedSession(proxy.url, lease, api_key=PROXY_KEY) as session:
                session.upsert("items", "c", {"id": "c"})
            client.release(lease)
        stale = httpx.put(row, json={"id": "r", "v": "stale"},
                          headers={**proxied, "Fencing-Token": old["token"]})
        assert stale.status_code == 409
        with LockClient(lockd.url, api_key=CLIENT_KEY) as client:
            lease = client.acquire("items/d", 5, auto_renew=False)
            secrets.extend((lease.lease_id, lease.token))
            with FencedSession(proxy.url, lease, api_key=PROXY_KEY) as session:
                session.upsert("items", "d", {"id": "d"})
            client.release(lease)
        # Secrets sent where they do not belong: a token as an API key, a lease id in a URL.
        assert http.get(f"{lockd.url}/v1/locks/{name}",
                        headers=_auth(new["token"])).status_code == 401
        assert http.get(f"{lockd.url}/v1/locks/{new['lease_id']}").status_code == 200
        assert httpx.post(f"{proxy.url}/v1/fences/{name}/claim",
                          headers={**proxied, "Fencing-Token": new["token"][:-4] + "AAAA"}
                          ).status_code == 401
        waiting = http.post(f"{lockd.url}/v1/locks/{name}/acquire",
                            json={"ttl_ms": 1000, "wait_ms": 300})
        assert waiting.status_code == 409
    assert lockd.stop() == 0 and proxy.stop() == 0
    logs = {"lockd": lockd.log(), "proxy": proxy.log()}
    for which, text in logs.items():
        lines = text.splitlines()
        assert len(lines) > 10, f"{which} logged too little to mean anything"
        assert all(json.loads(line)["level"] for line in lines)  # JSON, one object a line
        for secret in secrets:
            assert secret not in text, f"{which} log contains a secret"
            if "." in secret:  # a token: not even its signature or claims
                for part in secret.split(".")[1:]:
                    assert part not in text, f"{which} log contains part of a token"
    assert "[redacted]" in logs["lockd"]  # the lease id sent in a URL path, at DEBUG


def test_key_set_and_redaction():
    keys = KeySet(["abcdefgh1", "ijklmnop2"])
    assert keys.matches("abcdefgh1") and keys.matches(b"ijklmnop2")
    assert not keys.matches("abcdefgh") and not keys.matches("") and not keys.matches(None)
    assert not KeySet() and len(keys) == 2 and "abcdefgh1" not in repr(keys)
    lease_id = "xBGv1v8KI7A6XyOAi4YApX7nlJSX2fK1"
    token = "eyJhbGciOiJFZERTQSJ9.eyJsb2NrIjoiYSJ9.c2lnbmF0dXJl-_x"
    text = redact(f"id={lease_id} token {token} Authorization: Bearer k3y-v4lue lock a/b")
    assert lease_id not in text and token not in text and "k3y-v4lue" not in text
    assert "lock a/b" in text
    assert redact("test/0123456789abcdef0123456789abcdef") == "test/0123456789abcdef0123456789abcdef"


OTHER_CLIENT_KEY = "client-key-Other-4Rt7yUi"


def test_client_id_is_bound_to_the_api_key_that_sent_it(start_lockd, name):
    """The same ``client_id`` sent with another API key is NOT a retry of the
    holder's acquire: it must not receive the holder's lease id and token (409 held), while the
    same key still gets its own lease back."""
    lockd = start_lockd("sqlite", env={"LOCKD_API_KEYS": f"{CLIENT_KEY},{OTHER_CLIENT_KEY}"})
    url = f"{lockd.url}/v1/locks/{name}/acquire"
    client_id = "shared-Xo4TqQ8pLmW2vZr9aB"
    body = {"ttl_ms": 30_000, "client_id": client_id}
    mine = httpx.post(url, json=body, headers=_auth(CLIENT_KEY))
    assert mine.status_code == 200, mine.text
    lease = mine.json()
    theirs = httpx.post(url, json=body, headers=_auth(OTHER_CLIENT_KEY))
    _problem(theirs, 409, "held")
    assert lease["lease_id"] not in theirs.text and lease["token"] not in theirs.text
    again = httpx.post(url, json=body, headers=_auth(CLIENT_KEY))
    assert again.status_code == 200 and again.json()["lease_id"] == lease["lease_id"]


def test_scoped_keys_with_the_client_library(start_lockd, tmp_path):
    """An access file's scoped key works through ``LockClient`` inside its prefixes and is
    refused (403 ``forbidden_lock``) outside, next to an unscoped ``LOCKD_API_KEYS`` key; no
    log line holds a key."""
    scoped_key = "scoped-key-Vb82nQw1"
    access = tmp_path / "access.yaml"
    access.write_text(f"clients:\n  - name: team-a\n    key: {scoped_key}\n"
                      f"    prefixes: [\"team-a/\"]\nadmins:\n  - name: ops\n"
                      f"    key: {ADMIN_KEY}\n")
    lockd = start_lockd("sqlite", env={"LOCKD_API_KEYS": CLIENT_KEY, "LOCKD_LOG_FORMAT": "json"},
                        args=("--access-file", str(access), "--log-level", "debug"))
    with LockClient(lockd.url, api_key=scoped_key) as team_a:
        with team_a.lock("team-a/job", ttl=5):
            assert team_a.status("team-a/job").held
        with pytest.raises(PermissionDenied) as denied:
            team_a.try_acquire("team-b/job", ttl=5)
        assert denied.value.status == 403 and "team-a" in str(denied.value)
        assert [s.lock for s in team_a.locks()] == ["team-a/job"]
    with LockClient(lockd.url, api_key=CLIENT_KEY) as plain:
        assert plain.try_acquire("team-b/job", ttl=5) is not None
    forced = httpx.post(f"{lockd.url}/v1/locks/team-b/job/force-release", headers=_auth(ADMIN_KEY))
    assert forced.json()["released"] is True
    audit = httpx.get(f"{lockd.url}/v1/audit", headers=_auth(ADMIN_KEY)).json()["items"]
    assert [(e["identity"], e["action"]) for e in audit] == [("ops", "force_release")]
    log = lockd.log()
    assert '\\"action\\":\\"force_release\\"' in log
    for key in (scoped_key, CLIENT_KEY, ADMIN_KEY):
        assert key not in log
