"""What an access-file prefix covers: whole segments only (a prefix is ``""`` or ends with ``/``,
else the file is refused at start), and a semaphore's permits are judged by the semaphore's name
(what the identity was granted), not by their slot locks ``sem/{name}/{slot}``, in event streams
as in every other filter. Real ``lockd serve`` processes."""

from __future__ import annotations

import json
import subprocess
import threading
import uuid

import httpx
import pytest

from lockd.common.access import AccessFileError
from lockd.server.access import parse_access
from tests.server.calls import assert_problem, wait_until
from tests.server.conftest import LOCKD

KEY_A = "team-a-key-7Hq2wZ"
KEY_B = "team-b-key-Pp04Lm"
ACCESS = f"""
clients:
  - name: team-a
    key: {KEY_A}
    prefixes: ["team-a/"]
  - name: team-b
    key: {KEY_B}
    prefixes: ["team-b/"]
"""


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize("prefix", ["team-a", "team-a/x", "a:b"])
def test_a_prefix_that_does_not_end_a_segment_is_refused_at_start(tmp_path, prefix):
    access = tmp_path / "access.yaml"
    access.write_text(f"clients:\n  - {{name: a, key: abcdefgh12, prefixes: ['{prefix}']}}\n")
    proc = subprocess.run([LOCKD, "serve", "--access-file", str(access), "--store",
                           f"sqlite:///{tmp_path}/x.db", "--port", "0"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert f"prefix {prefix!r}" in line and "must end with '/'" in line, line
    with pytest.raises(AccessFileError, match="must end with '/'"):
        parse_access({"clients": [{"name": "a", "key": "k" * 8, "prefixes": [prefix]}]})
    table = parse_access({"clients": [{"name": "a", "key": "k" * 8,
                                       "prefixes": ["team-a/", "x/y/"]}]})
    assert table.identities[0].scope == ("team-a/", "x/y/")


@pytest.fixture
def scoped(lockd_factory, tmp_path):
    access = tmp_path / "access.yaml"
    access.write_text(ACCESS)
    return lockd_factory(f"sqlite:///{tmp_path}/lockd.db",
                         env={"LOCKD_ACCESS_FILE": str(access)})


def _collect(url: str, key: str, seen: list[dict], ready: threading.Event,
             stop: threading.Event) -> None:
    with httpx.stream("GET", url, headers=_auth(key), timeout=30) as response:
        assert response.status_code == 200, response.read()
        ready.set()
        for line in response.iter_lines():
            if line.startswith("data: "):
                seen.append(json.loads(line[6:]))
            if stop.is_set():
                return


def _stream(url: str, key: str, stop: threading.Event) -> list[dict]:
    seen: list[dict] = []
    ready = threading.Event()
    threading.Thread(target=_collect, args=(url, key, seen, ready, stop), daemon=True).start()
    assert ready.wait(10)
    return seen


def test_a_team_sees_its_own_semaphores_events_and_no_other_teams(scoped, http):
    url, run = scoped.url, uuid.uuid4().hex[:8]
    ours, theirs = f"team-b/{run}/pool", f"team-a/{run}/pool"
    stop = threading.Event()
    b_all = _stream(f"{url}/v1/events", KEY_B, stop)
    b_prefixed = _stream(f"{url}/v1/events?prefix=team-b/", KEY_B, stop)
    b_slot = _stream(f"{url}/v1/locks/sem/{ours}/0/events", KEY_B, stop)
    a_all = _stream(f"{url}/v1/events", KEY_A, stop)
    try:
        permit = http.post(f"{url}/v1/semaphores/{ours}/acquire", headers=_auth(KEY_B),
                           json={"ttl_ms": 30_000, "limit": 2, "owner": "b1"})
        assert permit.status_code == 200, permit.text
        other = http.post(f"{url}/v1/semaphores/{theirs}/acquire", headers=_auth(KEY_A),
                          json={"ttl_ms": 30_000, "limit": 2, "owner": "a1"})
        assert other.status_code == 200, other.text
        released = http.post(f"{url}/v1/semaphores/{ours}/release", headers=_auth(KEY_B),
                             json={"lease_id": permit.json()["lease_id"]})
        assert released.status_code == 200
        for seen in (b_all, b_prefixed, b_slot):
            wait_until(lambda seen=seen: len([e for e in seen if run in e["lock"]]) >= 2, 10,
                       "team-b's permit events")
        wait_until(lambda: any(run in e["lock"] for e in a_all), 10, "team-a's permit event")
    finally:
        stop.set()
    for seen in (b_all, b_prefixed, b_slot):
        mine = [(e["type"], e["lock"], e.get("semaphore")) for e in seen if run in e["lock"]]
        assert mine == [("acquired", f"sem/{ours}/0", ours), ("released", f"sem/{ours}/0", ours)]
    assert [e["lock"] for e in a_all if run in e["lock"]] == [f"sem/{theirs}/0"]
    # the slot lock of another team's semaphore stays out of reach
    body = assert_problem(http.get(f"{url}/v1/locks/sem/{theirs}/0/events",
                                   headers=_auth(KEY_B)), 403, "forbidden_lock")
    assert body["identity"] == "team-b"
