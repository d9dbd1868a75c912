"""Per-prefix access (``--access-file``): a scoped key cannot acquire, renew, release, list,
read or observe a lock outside its prefixes; an admin can; the audit trail records admin
actions; per-identity limits answer 429. Real ``lockd serve`` processes, real HTTP."""

from __future__ import annotations

import hashlib
import json
import subprocess
import threading
import uuid

import httpx
import pytest

from lockd import LimitExceeded, LockClient
from lockd.common.access import AccessFileError
from lockd.server.access import parse_access, visible_prefixes
from lockd.server.audit import AuditTrail
from tests.server.calls import assert_problem, wait_until
from tests.server.conftest import LOCKD

KEY_A = "team-a-key-7Hq2wZ"
KEY_B = "team-b-key-Pp04Lm"
KEY_OPS = "ops-admin-key-Xx93"
KEY_PLAIN = "plain-client-key-Q1"  # LOCKD_API_KEYS: unscoped

ACCESS = f"""
clients:
  - name: team-a
    key: {KEY_A}
    prefixes: ["a/"]
  - name: team-b
    key_sha256: {hashlib.sha256(KEY_B.encode()).hexdigest()}
    prefixes: ["b/", "shared/"]
admins:
  - name: ops
    key: {KEY_OPS}
"""


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def run() -> str:
    """A unique middle part for this test's lock names."""
    return uuid.uuid4().hex[:10]


def _serve(lockd_factory, tmp_path, store_url: str, **env: str):
    access = tmp_path / "access.yaml"
    access.write_text(ACCESS)
    return lockd_factory(store_url, env={"LOCKD_ACCESS_FILE": str(access),
                                         "LOCKD_API_KEYS": KEY_PLAIN, **env})


@pytest.fixture
def scoped(lockd_factory, tmp_path):
    return _serve(lockd_factory, tmp_path, f"sqlite:///{tmp_path}/lockd.db")


def _acquire(http, url, name, key, **fields):
    return http.post(f"{url}/v1/locks/{name}/acquire", json={"ttl_ms": 30_000, **fields},
                     headers=_auth(key))


def _forbidden(response: httpx.Response, lock: str, identity: str) -> None:
    body = assert_problem(response, 403, "forbidden_lock")
    assert body["lock"] == lock and body["identity"] == identity, body
    for secret in (KEY_A, KEY_B, KEY_OPS, KEY_PLAIN):
        assert secret not in response.text


def test_scoped_key_cannot_use_a_lock_outside_its_prefixes(scoped, http, run):
    url = scoped.url
    b_lock, a_lock = f"b/{run}/x", f"a/{run}/y"
    _forbidden(_acquire(http, url, b_lock, KEY_A), b_lock, "team-a")
    held = _acquire(http, url, b_lock, KEY_B)
    assert held.status_code == 200, held.text
    lease_id = held.json()["lease_id"]
    # even with the holder's lease id, team-a can neither renew nor release b's lock
    _forbidden(http.post(f"{url}/v1/locks/{b_lock}/renew", json={"lease_id": lease_id},
                         headers=_auth(KEY_A)), b_lock, "team-a")
    _forbidden(http.post(f"{url}/v1/locks/{b_lock}/release", json={"lease_id": lease_id},
                         headers=_auth(KEY_A)), b_lock, "team-a")
    _forbidden(http.get(f"{url}/v1/locks/{b_lock}", headers=_auth(KEY_A)), b_lock, "team-a")
    state = http.get(f"{url}/v1/locks/{b_lock}", headers=_auth(KEY_B)).json()
    assert state["held"] is True and state["fence"] == held.json()["fence"]  # nothing changed
    # a lock that does not exist is answered the same: the answer does not tell existence
    _forbidden(http.get(f"{url}/v1/locks/b/{run}/none", headers=_auth(KEY_A)),
               f"b/{run}/none", "team-a")
    # inside its prefixes team-a works as before
    mine = _acquire(http, url, a_lock, KEY_A)
    assert mine.status_code == 200
    assert http.post(f"{url}/v1/locks/{a_lock}/renew", json={"lease_id": mine.json()["lease_id"]},
                     headers=_auth(KEY_A)).status_code == 200
    assert http.post(f"{url}/v1/locks/{a_lock}/release",
                     json={"lease_id": mine.json()["lease_id"]},
                     headers=_auth(KEY_A)).status_code == 200
    # an admin and an unscoped key use every lock
    assert _acquire(http, url, f"b/{run}/admin", KEY_OPS).status_code == 200
    assert _acquire(http, url, f"zzz/{run}", KEY_PLAIN).status_code == 200


def test_a_lock_set_is_all_or_nothing(scoped, http, run):
    url = scoped.url
    locks = [f"a/{run}/1", f"b/{run}/2"]
    r = http.post(f"{url}/v1/leases/acquire", json={"locks": locks, "ttl_ms": 30_000},
                  headers=_auth(KEY_A))
    _forbidden(r, f"b/{run}/2", "team-a")
    assert http.get(f"{url}/v1/locks/{locks[0]}", headers=_auth(KEY_A)).json()["held"] is False
    ok = http.post(f"{url}/v1/leases/acquire", json={"locks": [f"a/{run}/1", f"a/{run}/3"],
                                                     "ttl_ms": 30_000}, headers=_auth(KEY_A))
    assert ok.status_code == 200, ok.text
    both = http.post(f"{url}/v1/leases/acquire", json={"locks": locks, "ttl_ms": 30_000,
                                                       "wait_ms": 0}, headers=_auth(KEY_OPS))
    assert both.status_code == 409  # the admin may ask; a/1 is held by team-a's set


def test_lists_show_only_the_scope(scoped, http, run):
    url = scoped.url
    names = [f"a/{run}/1", f"b/{run}/1", f"b/{run}/2", f"shared/{run}/1", f"z/{run}/1"]
    for name in names:
        assert _acquire(http, url, name, KEY_OPS).status_code == 200

    def listed(key: str, prefix: str = "", limit: int = 100) -> list[str]:
        seen, cursor = [], None
        while True:
            params = {"prefix": prefix, "limit": limit, **({"cursor": cursor} if cursor else {})}
            page = http.get(f"{url}/v1/locks", params=params, headers=_auth(key)).json()
            seen += [item["lock"] for item in page["items"]]
            cursor = page["next_cursor"]
            if cursor is None:
                return [n for n in seen if run in n]

    assert listed(KEY_A) == [f"a/{run}/1"]
    assert listed(KEY_A, "b/") == []
    assert listed(KEY_B) == [f"b/{run}/1", f"b/{run}/2", f"shared/{run}/1"]
    assert listed(KEY_B, limit=1) == [f"b/{run}/1", f"b/{run}/2", f"shared/{run}/1"]  # paged
    assert listed(KEY_B, f"b/{run}/2") == [f"b/{run}/2"]
    assert listed(KEY_OPS) == sorted(names)
    assert listed(KEY_PLAIN) == sorted(names)


def _events(url: str, key: str, path: str, seen: list[dict], ready: threading.Event,
            stop: threading.Event) -> None:
    with httpx.stream("GET", url + path, headers=_auth(key), timeout=30) as response:
        assert response.status_code == 200
        ready.set()
        for line in response.iter_lines():
            if line.startswith("data: "):
                seen.append(json.loads(line[6:]))
            if stop.is_set():
                return


def test_event_streams_show_only_the_scope_and_admins_see_the_audit(scoped, http, run):
    url = scoped.url
    _forbidden(http.get(f"{url}/v1/locks/b/{run}/x/events", headers=_auth(KEY_A)),
               f"b/{run}/x", "team-a")
    streams = {}
    stop = threading.Event()
    for who, key in (("a", KEY_A), ("ops", KEY_OPS)):
        seen: list[dict] = []
        ready = threading.Event()
        thread = threading.Thread(target=_events, daemon=True,
                                  args=(url, key, "/v1/events", seen, ready, stop))
        thread.start()
        assert ready.wait(10)
        streams[who] = seen
    assert _acquire(http, url, f"a/{run}/1", KEY_A).status_code == 200
    assert _acquire(http, url, f"b/{run}/1", KEY_B).status_code == 200
    forced = http.post(f"{url}/v1/locks/b/{run}/1/force-release", headers=_auth(KEY_OPS))
    assert forced.status_code == 200 and forced.json()["released"] is True
    wait_until(lambda: any(e["type"] == "audit" for e in streams["ops"]), 10, "audit event")
    wait_until(lambda: len([e for e in streams["ops"] if run in e.get("lock", "")
                            or run in e.get("target", "")]) >= 4, 10, "admin events")
    # each stream is its own connection: team a's may hear its event after the admin's
    wait_until(lambda: any(run in e.get("lock", "") for e in streams["a"]), 10,
               "team a's event")
    stop.set()
    assert [e["lock"] for e in streams["a"] if run in e["lock"]] == [f"a/{run}/1"]
    assert not any(e["type"] == "audit" for e in streams["a"])
    audit = next(e for e in streams["ops"] if e["type"] == "audit")
    assert audit["action"] == "force_release" and audit["identity"] == "ops"
    assert audit["target"] == f"b/{run}/1" and audit["result"] == "released"
    # a replay (history) of team-a shows nothing of b either
    with httpx.stream("GET", f"{url}/v1/events?history=50", headers=_auth(KEY_A),
                      timeout=5) as response:
        head = b""
        for chunk in response.iter_bytes():
            head += chunk
            if b"connected" in head and (b"a/" in head or len(head) > 4096):
                break
    assert f"b/{run}".encode() not in head and f"a/{run}/1".encode() in head


def test_audit_trail_records_force_release(scoped, http, run):
    url = scoped.url
    lock = f"b/{run}/1"
    lease = _acquire(http, url, lock, KEY_B).json()
    assert_problem(http.get(f"{url}/v1/audit", headers=_auth(KEY_B)), 403, "forbidden")
    assert_problem(http.get(f"{url}/v1/audit"), 401, "unauthorized")
    forced = http.post(f"{url}/v1/locks/{lock}/force-release",
                       headers={**_auth(KEY_OPS), "X-Request-Id": f"audit-{run}"})
    assert forced.status_code == 200
    http.post(f"{url}/v1/locks/{lock}/force-release", headers=_auth(KEY_OPS))  # nothing held
    page = http.get(f"{url}/v1/audit", params={"since": 0, "limit": 1},
                    headers=_auth(KEY_OPS)).json()
    first = page["items"][0]
    assert first["identity"] == "ops" and first["action"] == "force_release"
    assert first["target"] == lock and first["result"] == "released"
    assert first["request_id"] == f"audit-{run}" and first["detail"]["fence"] == lease["fence"]
    assert page["next_since"] == first["id"]
    rest = http.get(f"{url}/v1/audit", params={"since": page["next_since"]},
                    headers=_auth(KEY_OPS)).json()
    assert [(e["action"], e["result"]) for e in rest["items"]] == [("force_release", "not_held")]
    assert rest["next_since"] is None
    assert_problem(http.get(f"{url}/v1/audit", params={"limit": 0}, headers=_auth(KEY_OPS)),
                   422, "invalid_request")
    log = scoped.log()
    assert '"action":"force_release"' in log and KEY_OPS not in log


def test_scope_denials_are_audited_above_a_rate(scoped, http, run):
    url = scoped.url
    for i in range(9):
        assert _acquire(http, url, f"b/{run}/{i}", KEY_A).status_code == 403
    audit = http.get(f"{url}/v1/audit", headers=_auth(KEY_OPS)).json()["items"]
    assert not [e for e in audit if e["action"] == "scope_denied"]
    for i in range(9, 30):
        assert _acquire(http, url, f"b/{run}/{i}", KEY_A).status_code == 403
    denials = [e for e in http.get(f"{url}/v1/audit", headers=_auth(KEY_OPS)).json()["items"]
               if e["action"] == "scope_denied"]
    assert len(denials) == 1  # one entry per identity and window, not one per denial
    assert denials[0]["identity"] == "team-a" and denials[0]["detail"]["count"] == 10
    metrics = http.get(f"{url}/metrics").text
    assert 'lockd_auth_failures_total{reason="forbidden_lock"} 30.0' in metrics
    assert f"b/{run}" not in metrics  # metrics stay aggregate


def test_per_identity_limits_answer_429(lockd_factory, tmp_path, http, run):
    server = _serve(lockd_factory, tmp_path, f"sqlite:///{tmp_path}/limits.db",
                    LOCKD_MAX_LEASES_PER_IDENTITY="2", LOCKD_MAX_WAITERS_PER_IDENTITY="1")
    url = server.url
    leases = [_acquire(http, url, f"a/{run}/{i}", KEY_A).json() for i in range(2)]
    over = _acquire(http, url, f"a/{run}/2", KEY_A)
    body = assert_problem(over, 429, "too_many_leases")
    assert body["identity"] == "team-a" and int(over.headers["Retry-After"]) >= 1
    other = _acquire(http, url, f"b/{run}/0", KEY_B)
    assert other.status_code == 200  # others unaffected
    assert http.post(f"{url}/v1/locks/b/{run}/0/release", headers=_auth(KEY_B),
                     json={"lease_id": other.json()["lease_id"]}).status_code == 200
    released = http.post(f"{url}/v1/locks/a/{run}/0/release",
                         json={"lease_id": leases[0]["lease_id"]}, headers=_auth(KEY_A))
    assert released.status_code == 200
    assert _acquire(http, url, f"a/{run}/2", KEY_A).status_code == 200  # room again
    with LockClient(url, api_key=KEY_A) as client, pytest.raises(LimitExceeded) as over_limit:
        client.try_acquire(f"a/{run}/3", ttl=10)  # the client's own type, with the wait
    assert over_limit.value.code == "too_many_leases" and over_limit.value.retry_after >= 1
    # waiters: ops holds b/w; team-b's first waiting acquire queues (and counts as one of its
    # leases while it waits), the second is refused as a waiter
    assert _acquire(http, url, f"b/{run}/w", KEY_OPS).status_code == 200
    results: list[int] = []
    waiter = threading.Thread(target=lambda: results.append(
        _acquire(http, url, f"b/{run}/w", KEY_B, wait_ms=3_000).status_code))
    waiter.start()
    wait_until(lambda: http.get(f"{url}/v1/locks/b/{run}/w",
                                headers=_auth(KEY_OPS)).json()["waiters"] == 1, 10, "queued")
    second = _acquire(http, url, f"b/{run}/w", KEY_B, wait_ms=3_000)
    assert assert_problem(second, 429, "too_many_waiters")["identity"] == "team-b"
    assert second.headers["Retry-After"] == "1"
    waiter.join(10)
    assert results == [409]
    metrics = http.get(f"{url}/metrics").text
    assert 'lockd_identity_limited_total{identity="team-a",limit="leases"} 2.0' in metrics  # HTTP, then LockClient
    assert 'lockd_identity_limited_total{identity="team-b",limit="waiters"} 1.0' in metrics


def test_scope_holds_on_every_store(store_url, lockd_factory, tmp_path, http, run):
    server = _serve(lockd_factory, tmp_path, store_url)
    url = server.url
    _forbidden(_acquire(http, url, f"b/{run}/1", KEY_A), f"b/{run}/1", "team-a")
    for name in (f"a/{run}/1", f"b/{run}/1", f"shared/{run}/1"):
        assert _acquire(http, url, name, KEY_OPS).status_code == 200
    page = http.get(f"{url}/v1/locks", params={"limit": 1000}, headers=_auth(KEY_B)).json()
    assert [i["lock"] for i in page["items"] if run in i["lock"]] == [f"b/{run}/1",
                                                                      f"shared/{run}/1"]


@pytest.mark.parametrize("text, message", [
    ("clients:\n  - {name: x, key: abcdefgh12, prefixes: [a/], color: red}\n",
     "unknown field 'color'"),
    ("teams: []\n", "unknown field 'teams'"),
    ("clients:\n  - {name: x, key: abcdefgh12, prefixes: []}\n", "prefixes must be a non-empty"),
    ("clients:\n  - {name: x, key: abcdefgh12}\n", "prefixes must be a non-empty"),
    ("clients:\n  - {name: x, key: abcdefgh12, prefixes: [a/]}\n"
     "  - {name: y, key: abcdefgh12, prefixes: [b/]}\n", "duplicate key"),
    ("clients:\n  - {name: x, key: abcdefgh12, prefixes: [a/]}\n"
     f"admins:\n  - {{name: y, key_sha256: {hashlib.sha256(b'abcdefgh12').hexdigest()}}}\n",
     "duplicate key"),
    ("clients:\n  - {name: x, prefixes: [a/]}\n", "exactly one of key, key_sha256, subject"),
    ("clients:\n  - {name: x, key: abcdefgh12, subject: CN=x, prefixes: [a/]}\n",
     "exactly one of"),
    ("admins:\n  - {name: x, key: abcdefgh12, prefixes: [a/]}\n", "unknown field 'prefixes'"),
    ("clients: [\n", "not valid YAML"),
])
def test_a_bad_access_file_is_refused_at_start(tmp_path, text, message):
    access = tmp_path / "access.yaml"
    access.write_text(text)
    proc = subprocess.run([LOCKD, "serve", "--access-file", str(access), "--store",
                           f"sqlite:///{tmp_path}/x.db", "--port", "0"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "abcdefgh12" not in lines[0], lines


def test_access_rules():
    table = parse_access({"clients": [{"name": "c", "subject": "CN=c, O=Acme",
                                       "prefixes": ["x/", "x/y/", "w/"]},
                                      {"name": "all", "key": "k" * 8, "prefixes": [""]}]})
    (everyone,) = [i for i in table.identities if i.name == "all"]
    assert everyone.scope is None  # [""] means every lock
    scoped = table.by_subject("CN=c,O=Acme")
    assert scoped is not None and scoped.role == "client"
    scope = {"lockd.identity": scoped}
    assert visible_prefixes(scope, "") == ("w/", "x/")  # x/y/ lies inside x/
    assert visible_prefixes(scope, "x/y/z") == ("x/y/z",)
    assert visible_prefixes(scope, "v") == ()
    assert table.by_key(b"k" * 8) is everyone and table.by_key(b"nope-nope") is None
    with pytest.raises(AccessFileError, match="name must be"):
        parse_access({"clients": [{"name": "bad name", "key": "k" * 8, "prefixes": ["a"]}]})


def test_audit_ring_is_bounded_and_paged():
    trail = AuditTrail(size=3)
    for i in range(5):
        trail.record("ops", "force_release", f"l/{i}", "released", f"r{i}")
    page, next_since = trail.since(0, 2)
    assert [e.target for e in page] == ["l/2", "l/3"] and next_since == 4
    page, next_since = trail.since(next_since, 2)
    assert [e.target for e in page] == ["l/4"] and next_since is None


def test_certificate_subjects_and_keys_become_identities():
    """The request middleware puts the identity of a listed key or certificate subject in the
    ASGI scope; keys of LOCKD_API_KEYS stay unscoped identities named by their key id."""
    import asyncio

    from lockd.common.keys import KeySet
    from lockd.common.middleware import IDENTITY, RequestMiddleware

    table = parse_access({"clients": [{"name": "c", "subject": "CN=c,O=Acme",
                                       "prefixes": ["c/"]},
                                      {"name": "k", "key": KEY_A, "prefixes": ["k/"]}]})
    seen: list = []

    async def app(scope, receive, send):
        seen.append(scope.get(IDENTITY))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    middleware = RequestMiddleware(app, api_keys=KeySet([KEY_PLAIN]), admin_keys=KeySet(),
                                   identities=table)

    async def call(key: str | None = None, subject: str | None = None) -> int:
        headers = [(b"authorization", f"Bearer {key}".encode())] if key else []
        scope = {"type": "http", "method": "GET", "path": "/v1/locks", "headers": headers,
                 "extensions": {"tls": {"client_cert_name": subject}} if subject else {}}
        sent: list = []

        async def send(message):
            sent.append(message)

        await middleware(scope, None, send)
        return sent[0]["status"]

    async def main() -> list[int]:
        return [await call(subject="CN=c,O=Acme"), await call(KEY_A), await call(KEY_PLAIN),
                await call(subject="CN=other"), await call("wrong-key-123")]

    assert asyncio.run(main()) == [204, 204, 204, 401, 401]
    by_cert, by_key, plain = seen
    assert (by_cert.name, by_cert.scope) == ("c", ("c/",))
    assert (by_key.name, by_key.scope, by_key.role) == ("k", ("k/",), "client")
    assert plain.scope is None and plain.name == KeySet([KEY_PLAIN]).identify(KEY_PLAIN)
