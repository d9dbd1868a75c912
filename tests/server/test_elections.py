"""Leader election over HTTP, against a real ``lockd serve`` on every store kind.

One leader at a time under 16 candidate threads and candidate processes that are killed (SIGKILL)
or frozen (SIGSTOP) while they lead; fences strictly increase per term; observe delivers every
change in order and resumes without gaps; proclaim keeps the fence; handover picks the preferred
candidate; resign and expiry hand over to the next; bad input changes nothing.
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.jitter import hold_sync
from tests.server.calls import assert_problem, wait_until
from tests.server.election_calls import (
    Observer,
    call,
    campaign,
    claims,
    election,
    parse_sse,
    queue_candidates,
    read_events,
    result,
    stable,
)

CANDIDATE = Path(__file__).with_name("election_candidate.py")
ADMIN_KEY = "admin-key-0123456789abcdef"


# --- the basic contract ---------------------------------------------------------------------------


def test_campaign_proclaim_renew_resign_and_get(lockd, http, name):
    url = lockd.url
    assert election(http, url, name) == {
        "election": name, "leader": None, "value": "", "fence": 0, "seq": 0,
        "handover_to": None, "waiters": 0, "waiting_owners": []}
    a = campaign(http, url, name, owner="A", value="a:1")
    assert a.status_code == 200, a.text
    a = a.json()
    assert (a["election"], a["lock"], a["owner"], a["value"]) == (name, name, "A", "a:1")
    assert a["fence"] >= 1 and 0 < a["ttl_ms"] <= 10_000
    assert (claims(a["token"])["lock"], claims(a["token"])["fence"]) == (name, a["fence"])
    now = election(http, url, name)
    assert now["leader"]["owner"] == "A" and 0 < now["leader"]["ttl_ms"] <= 10_000
    assert (now["value"], now["fence"]) == ("a:1", a["fence"]) and now["seq"] >= 1
    lock = http.get(f"{url}/v1/locks/{name}").json()  # the leader IS the lock's holder
    assert (lock["held"], lock["owner"], lock["fence"]) == (True, "A", a["fence"])

    busy = assert_problem(campaign(http, url, name, owner="B", value="b"), 409, "held")
    assert busy["owner"] == "A" and "Retry-After" in campaign(http, url, name).headers
    assert http.post(f"{url}/v1/locks/{name}/acquire", json={"ttl_ms": 1000}).status_code == 409

    p = call(http, url, name, "proclaim", lease_id=a["lease_id"], value="a:2")
    assert p.status_code == 200, p.text
    assert p.json() == {"election": name, "owner": "A", "value": "a:2", "fence": a["fence"],
                        "seq": now["seq"] + 1}
    after = election(http, url, name)
    assert (after["value"], after["fence"], after["seq"]) == ("a:2", a["fence"], now["seq"] + 1)

    r = call(http, url, name, "renew", lease_id=a["lease_id"], ttl_ms=5000)
    assert r.status_code == 200, r.text
    renewed = r.json()
    assert (renewed["fence"], renewed["token"], renewed["lease_id"]) == (
        a["fence"], a["token"], a["lease_id"])
    assert renewed["handover_requested"] is False and renewed["handover_to"] is None
    assert 0 < renewed["ttl_ms"] <= 5000

    assert_problem(call(http, url, name, "proclaim", lease_id="not-the-lease", value="x"),
                   410, "lease_lost")
    r = call(http, url, name, "resign", lease_id=a["lease_id"])
    assert r.status_code == 200 and r.json() == {"resigned": True}
    gone = election(http, url, name)
    assert gone["leader"] is None and gone["value"] == "" and gone["seq"] == after["seq"] + 1
    assert gone["fence"] == a["fence"]
    for action, extra in (("renew", {}), ("resign", {}), ("proclaim", {"value": "late"})):
        assert_problem(call(http, url, name, action, lease_id=a["lease_id"], **extra),
                       410, "lease_lost")
    assert election(http, url, name)["seq"] == gone["seq"]  # the refusals logged nothing

    b = campaign(http, url, name, owner="B", value="b").json()
    assert b["fence"] > a["fence"] and b["lease_id"] != a["lease_id"]


def test_resign_hands_to_the_next_candidate_in_order(lockd, http, name):
    url = lockd.url
    a = campaign(http, url, name, owner="A").json()
    results: list = []
    threads = queue_candidates(http, url, name, ["B", "C"], results)
    assert election(http, url, name)["waiting_owners"] == ["B", "C"]
    assert call(http, url, name, "resign", lease_id=a["lease_id"]).status_code == 200
    threads["B"].join(10)
    b = result(results, "B")
    assert b["fence"] > a["fence"] and b["value"] == "v-B"
    now = election(http, url, name)
    assert now["leader"]["owner"] == "B" and now["value"] == "v-B"
    assert now["waiting_owners"] == ["C"]
    assert call(http, url, name, "resign", lease_id=b["lease_id"]).status_code == 200
    threads["C"].join(10)
    assert result(results, "C")["fence"] > b["fence"]


def test_an_expired_leader_hands_over_to_the_next(lockd, http, name):
    url = lockd.url
    sent = time.monotonic()
    a = campaign(http, url, name, 1000, owner="A").json()
    results: list = []
    threads = queue_candidates(http, url, name, ["B"], results)
    threads["B"].join(15)
    elected_at = time.monotonic()
    b = result(results, "B")
    assert elected_at - sent >= 1.0, "elected before the leader's lease ran out"
    assert b["fence"] > a["fence"]
    assert_problem(call(http, url, name, "renew", lease_id=a["lease_id"]), 410, "lease_lost")
    log = read_events(url, name, 2, last_id="0")
    assert [(k, d["owner"], d["fence"]) for _, k, d in log] == [
        ("leader", "A", a["fence"]), ("leader", "B", b["fence"])]  # a lapse is no resign


def test_a_candidate_that_goes_away_leaves_the_queue(lockd, http, name):
    url = lockd.url
    a = campaign(http, url, name, owner="A").json()
    with pytest.raises(httpx.ReadTimeout):  # the client gives up: its connection closes
        httpx.post(f"{url}/v1/elections/{name}/campaign", timeout=httpx.Timeout(10, read=0.5),
                   json={"ttl_ms": 10_000, "wait_ms": 20_000, "owner": "gone"})
    wait_until(lambda: election(http, url, name)["waiters"] == 0, what="the candidate gone")
    assert call(http, url, name, "resign", lease_id=a["lease_id"]).status_code == 200
    time.sleep(0.2)  # proves: nobody is elected in the departed candidate's place (200 ms)
    assert election(http, url, name)["leader"] is None  # nobody was elected in its place
    log = read_events(url, name, 2, last_id="0")
    assert [(k, d["owner"]) for _, k, d in log] == [("leader", "A"), ("resign", "A")]


# --- handover -------------------------------------------------------------------------------------


def test_handover_picks_the_preferred_candidate(store_url, lockd_factory, http, name):
    lockd = lockd_factory(store_url, env={"LOCKD_ADMIN_KEYS": ADMIN_KEY})
    url, admin = lockd.url, {"Authorization": f"Bearer {ADMIN_KEY}"}
    a = campaign(http, url, name, owner="A").json()
    results: list = []
    threads = queue_candidates(http, url, name, ["B", "C", "D"], results)

    assert_problem(call(http, url, name, "handover", target="D"), 401, "unauthorized")
    assert_problem(call(http, url, name, "handover", target="D", lease_id="not-the-lease"),
                   410, "lease_lost")
    assert_problem(call(http, url, name, "handover", target="", lease_id=a["lease_id"]),
                   422, "invalid_request")
    assert election(http, url, name)["handover_to"] is None  # the refusals changed nothing

    r = call(http, url, name, "handover", target="D", lease_id=a["lease_id"])
    assert r.status_code == 200 and r.json() == {"election": name, "handover_to": "D"}
    now = election(http, url, name)
    assert now["handover_to"] == "D" and now["leader"]["owner"] == "A"
    assert now["waiting_owners"] == ["D", "B", "C"]  # the preferred candidate goes first
    renewed = call(http, url, name, "renew", lease_id=a["lease_id"]).json()
    assert renewed["handover_requested"] is True and renewed["handover_to"] == "D"
    assert call(http, url, name, "resign", lease_id=a["lease_id"]).status_code == 200
    threads["D"].join(10)
    d = result(results, "D")
    assert d["fence"] > a["fence"]
    now = election(http, url, name)
    assert now["leader"]["owner"] == "D" and now["handover_to"] is None
    assert now["waiting_owners"] == ["B", "C"]
    assert not [o for o, _ in results if o in ("B", "C")]

    r = call(http, url, name, "handover", headers=admin, target="next")  # an admin, no lease
    assert r.status_code == 200, r.text
    renewed = call(http, url, name, "renew", lease_id=d["lease_id"]).json()
    assert renewed["handover_requested"] is True and renewed["handover_to"] == "next"
    assert call(http, url, name, "resign", lease_id=d["lease_id"]).status_code == 200
    threads["B"].join(10)
    b = result(results, "B")
    assert b["fence"] > d["fence"] and election(http, url, name)["leader"]["owner"] == "B"
    call(http, url, name, "resign", lease_id=b["lease_id"])
    threads["C"].join(10)

    nobody = f"{name}-nobody"
    assert_problem(call(http, url, nobody, "handover", headers=admin, target="next"),
                   409, "no_leader")
    trail = http.get(f"{url}/v1/audit", headers=admin).json()["items"]
    handovers = [(e["result"], e["detail"]["handover_to"], e["detail"]["by"])
                 for e in trail if e["action"] == "election_handover"]
    assert handovers == [("lease_lost", "D", "leader"), ("requested", "D", "leader"),
                         ("requested", "next", "admin"), ("no_leader", "next", "admin")]
    metrics = http.get(f"{url}/metrics").text
    assert "lockd_election_handovers_total 2.0" in metrics  # the two that were recorded
    assert "lockd_election_leader_changes_total 4.0" in metrics  # A, D, B, C
    assert "lockd_election_term_seconds_count 3.0" in metrics  # A, D and B resigned


def test_a_forced_handover_is_the_admins_force_release(store_url, lockd_factory, http, name):
    lockd = lockd_factory(store_url, env={"LOCKD_ADMIN_KEYS": ADMIN_KEY})
    url, admin = lockd.url, {"Authorization": f"Bearer {ADMIN_KEY}"}
    a = campaign(http, url, name, owner="A").json()
    results: list = []
    threads = queue_candidates(http, url, name, ["B"], results)
    r = http.post(f"{url}/v1/locks/{name}/force-release", headers=admin)
    assert r.status_code == 200 and r.json()["owner"] == "A", r.text
    threads["B"].join(10)
    b = result(results, "B")
    assert b["fence"] > a["fence"] and election(http, url, name)["leader"]["owner"] == "B"
    assert_problem(call(http, url, name, "renew", lease_id=a["lease_id"]), 410, "lease_lost")
    assert_problem(call(http, url, name, "proclaim", lease_id=a["lease_id"], value="late"),
                   410, "lease_lost")
    log = read_events(url, name, 2, last_id="0")
    assert [(k, d["owner"], d["fence"]) for _, k, d in log] == [
        ("leader", "A", a["fence"]), ("leader", "B", b["fence"])]


# --- observe --------------------------------------------------------------------------------------


def test_observe_delivers_every_change_in_order_and_resumes_without_gaps(lockd, http, name):
    url = lockd.url
    a = campaign(http, url, name, owner="A", value="a1").json()
    call(http, url, name, "proclaim", lease_id=a["lease_id"], value="a2")
    start = election(http, url, name)
    (first,) = read_events(url, name, 1)
    assert first[:2] == (start["seq"], "state")
    assert stable(first[2]) == stable({k: v for k, v in start.items()
                                         if k not in ("waiters", "waiting_owners")})

    seen: list = []
    with httpx.stream("GET", f"{url}/v1/elections/{name}/observe",
                      timeout=httpx.Timeout(10)) as stream:
        lines = stream.iter_lines()
        parse_sse(lines, seen, 1)  # the state: from here on every change arrives
        call(http, url, name, "proclaim", lease_id=a["lease_id"], value="a3")
        call(http, url, name, "resign", lease_id=a["lease_id"])
        b = campaign(http, url, name, owner="B", value="b1").json()
        parse_sse(lines, seen, 4)
    # disconnected; changes go on meanwhile
    call(http, url, name, "proclaim", lease_id=b["lease_id"], value="b2")
    call(http, url, name, "resign", lease_id=b["lease_id"])
    c = campaign(http, url, name, owner="C", value="c1").json()
    resumed = read_events(url, name, 3, last_id=str(seen[-1][0]))
    changes = seen[1:] + resumed
    s = start["seq"]
    assert [e[0] for e in changes] == list(range(s + 1, s + 7))  # every seq, once, in order
    assert [(k, d["seq"], d["owner"], d["value"], d["fence"]) for _, k, d in changes] == [
        ("proclaim", s + 1, "A", "a3", a["fence"]), ("resign", s + 2, "A", "", a["fence"]),
        ("leader", s + 3, "B", "b1", b["fence"]), ("proclaim", s + 4, "B", "b2", b["fence"]),
        ("resign", s + 5, "B", "", b["fence"]), ("leader", s + 6, "C", "c1", c["fence"])]
    assert a["fence"] < b["fence"] < c["fence"]
    assert all(d["election"] == name for _, _, d in changes)

    everything = read_events(url, name, s + 6, last_id="0")  # the whole log, from the start
    assert [e[0] for e in everything] == list(range(1, s + 7))
    assert everything[-6:] == changes
    (future,) = read_events(url, name, 1, last_id="999999")  # an id never reached: afresh
    assert future[1] == "state" and future[0] == s + 6 and future[2]["leader"]["owner"] == "C"
    bad = http.get(f"{url}/v1/elections/{name}/observe", headers={"Last-Event-ID": "x1"})
    assert_problem(bad, 422, "invalid_request")
    text = json.dumps(everything)
    assert a["lease_id"] not in text and a["token"] not in text


# --- bad input ------------------------------------------------------------------------------------


def test_bad_input_is_a_4xx_problem_and_changes_nothing(lockd, http, name):
    url = lockd.url
    bad_campaigns = [
        {"ttl_ms": 10_000, "value": "x" * 4097},
        {"ttl_ms": 10_000, "value": "€" * 1366},  # 1366 characters, 4098 bytes
        {"ttl_ms": 1}, {"ttl_ms": 10**9}, {"ttl_ms": "10000"}, {"ttl_ms": 10_000, "wait_ms": -1},
        {"ttl_ms": 10_000, "value": 7}, {"ttl_ms": 10_000, "owner": "o" * 256},
        {"ttl_ms": 10_000, "client_id": "short"}, {"ttl_ms": 10_000, "wait": 100}, {},
    ]
    for body in bad_campaigns:
        r = http.post(f"{url}/v1/elections/{name}/campaign", json=body)
        assert_problem(r, 422, "invalid_request")
    assert_problem(campaign(http, url, "bad!name"), 422, "invalid_request")
    assert_problem(http.post(f"{url}/v1/elections/{name}/campaign", content=b"{nope",
                             headers={"content-type": "application/json"}),
                   422, "invalid_request")
    assert_problem(http.get(f"{url}/v1/elections/bad!name"), 422, "invalid_request")
    assert_problem(http.get(f"{url}/v1/elections/bad!name/observe"), 422, "invalid_request")
    assert election(http, url, name)["seq"] == 0 and election(http, url, name)["fence"] == 0

    full = "€" * 1365 + "x"  # exactly 4096 bytes
    a = campaign(http, url, name, owner="A", value=full)
    assert a.status_code == 200, a.text
    a = a.json()
    before = election(http, url, name)
    lease = a["lease_id"]
    refused = [
        ("proclaim", {"lease_id": lease, "value": full + "x"}),
        ("proclaim", {"lease_id": lease}),
        ("renew", {"lease_id": lease, "ttl_ms": 1}),
        ("renew", {"lease_id": ""}),
        ("resign", {}),
        ("handover", {"lease_id": lease, "target": ""}),
        ("handover", {"lease_id": lease, "target": "t" * 256}),
        ("handover", {"lease_id": lease, "target": "line\nbreak"}),
        ("handover", {"lease_id": lease}),
    ]
    for action, body in refused:
        assert_problem(call(http, url, name, action, **body), 422, "invalid_request")
    assert_problem(call(http, url, name, "proclaim", lease_id=lease, value="y" * 70_000),
                   413, "payload_too_large")
    after = election(http, url, name)
    assert stable(after) == stable(before)
    assert after["value"] == full and after["handover_to"] is None
    assert call(http, url, name, "renew", lease_id=lease).json()["fence"] == a["fence"]


# --- one leader at a time -------------------------------------------------------------------------


def _reader(proc: subprocess.Popen, owner: str, out: queue.Queue) -> None:
    for line in proc.stdout:
        out.put((owner, json.loads(line)))


def test_one_leader_at_a_time_under_16_candidates_with_kill_and_stop(store_url, lockd_factory,
                                                                     name):
    lockd = lockd_factory(store_url, env={"LOCKD_EVENTS_HEARTBEAT_MS": "200"})
    url, ttl_ms = lockd.url, 1000
    observer = Observer(url, name)
    observer.start()
    wait_until(lambda: observer.events, what="the observer's first event")
    grants: list[tuple[int, str, float]] = []  # (fence, owner, when its answer arrived)
    ops: list[tuple[int, str, float, int]] = []  # (fence, renew|resign, sent, status)
    errors: list[BaseException] = []
    lock, stop = threading.Lock(), threading.Event()

    def candidate(i: int) -> None:
        owner, rng = f"thread-{i}", random.Random(i)
        try:
            with httpx.Client(timeout=30) as c:
                while not stop.is_set():
                    r = campaign(c, url, name, ttl_ms, wait_ms=10_000, owner=owner, value=owner)
                    if r.status_code == 409:
                        continue
                    assert r.status_code == 200, r.text
                    lease, got = r.json(), time.monotonic()
                    with lock:
                        grants.append((lease["fence"], owner, got))
                    lead_until = got + (0 if stop.is_set() else rng.uniform(0.05, 0.3))
                    abandon = rng.random() < 0.08 and not stop.is_set()
                    while time.monotonic() < lead_until or abandon:
                        # renewal pacing, or an abandoned lease left past its TTL
                        hold_sync(None, 0.1 if not abandon else ttl_ms / 1000 + 0.5)
                        sent = time.monotonic()
                        status = call(c, url, name, "renew", lease_id=lease["lease_id"]
                                      ).status_code
                        with lock:
                            ops.append((lease["fence"], "renew", sent, status))
                        if status != 200 or abandon:
                            break
                    else:
                        sent = time.monotonic()
                        status = call(c, url, name, "resign", lease_id=lease["lease_id"]
                                      ).status_code
                        with lock:
                            ops.append((lease["fence"], "resign", sent, status))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=candidate, args=(i,), daemon=True) for i in range(16)]
    for t in threads:
        t.start()
    out: queue.Queue = queue.Queue()
    procs: dict[str, subprocess.Popen] = {}
    for owner in ("proc-kill-1", "proc-stop-1", "proc-kill-2", "proc-stop-2"):
        procs[owner] = subprocess.Popen(
            [sys.executable, str(CANDIDATE), url, name, owner, str(ttl_ms)],
            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        threading.Thread(target=_reader, args=(procs[owner], owner, out), daemon=True).start()
    frozen: dict[str, int] = {}  # owner -> its fence, while SIGSTOPped
    reports: dict[str, list[dict]] = {owner: [] for owner in procs}
    deadline = time.monotonic() + 90
    try:
        while any(p.poll() is None for p in procs.values()) or len(grants) < 30:
            assert time.monotonic() < deadline, "the election did not go round in time"
            try:
                owner, line = out.get(timeout=0.1)
            except queue.Empty:
                owner, line = None, None
            if line is not None:
                reports[owner].append(line)
                if line["event"] == "elected":
                    with lock:
                        grants.append((line["fence"], owner, line["at"]))
                    sig = signal.SIGKILL if "kill" in owner else signal.SIGSTOP
                    procs[owner].send_signal(sig)
                    if sig == signal.SIGSTOP:
                        frozen[owner] = line["fence"]
            for owner, fence in list(frozen.items()):
                with lock:
                    succeeded = any(f > fence for f, _, _ in grants)
                if succeeded:  # thaw it once another leader is elected: its renewal must fail
                    procs[owner].send_signal(signal.SIGCONT)
                    del frozen[owner]
    finally:
        stop.set()
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
            p.wait(10)
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    while not out.empty():
        owner, line = out.get()
        reports[owner].append(line)

    # Each frozen leader tried to renew after it thawed and was refused.
    for owner, report in reports.items():
        elected, *renewals = report
        assert elected["event"] == "elected", report
        if "stop" in owner:
            assert renewals and renewals[-1]["status"] == 410, report
        ops.extend((elected["fence"], "renew", r["sent"], r["status"]) for r in renewals)
    # Fences: one per term, never reused.
    fences = [f for f, _, _ in grants]
    assert len(set(fences)) == len(fences)
    # One leader at a time: no renewal or resignation of a term succeeded once it had been
    # sent after a later term's leader was told it leads.
    for fence, what, sent, status in ops:
        if status == 200:
            later = [at for f, _, at in grants if f > fence]
            assert not later or sent < min(later), (fence, what, sent, min(later))
    # The observer saw every change in order; each term once, with its fence and owner.
    with httpx.Client(timeout=10) as c:
        last = election(c, url, name)["seq"]
    observer.wait_for_seq(last)
    observer.stop.set()
    state, *changes = observer.events
    assert state[1] == "state"
    assert [e[0] for e in changes] == list(range(state[0] + 1, last + 1))
    terms = [(d["fence"], d["owner"]) for _, k, d in changes if k == "leader"]
    assert [f for f, _ in terms] == sorted({f for f, _ in terms})  # strictly increasing
    assert sorted((f, o) for f, o, _ in grants) == terms


def test_observe_streams_are_bounded_kept_alive_and_end_when_lockd_stops(store_url, lockd_factory,
                                                                        name):
    lockd = lockd_factory(store_url, env={"LOCKD_MAX_EVENT_STREAMS": "2",
                                          "LOCKD_EVENTS_HEARTBEAT_MS": "100"})
    url = f"{lockd.url}/v1/elections/{name}/observe"
    lines: list[str] = []
    ended = threading.Event()

    def observe() -> None:
        with httpx.stream("GET", url, timeout=httpx.Timeout(10)) as r:
            for line in r.iter_lines():
                lines.append(line)
        ended.set()

    threading.Thread(target=observe, daemon=True).start()
    wait_until(lambda: lines.count(": keepalive") >= 2, what="keepalive comments")
    with httpx.stream("GET", f"{lockd.url}/v1/events", timeout=httpx.Timeout(10)) as events:
        assert events.status_code == 200  # lock event streams and observers share the bound
        r = httpx.get(url, timeout=10)
        assert_problem(r, 503, "too_many_streams")
        assert r.headers["Retry-After"] == "5"
    wait_until(lambda: httpx.get(f"{lockd.url}/v1/elections/{name}").status_code == 200,
               what="lockd still answering")
    started = time.monotonic()
    assert lockd.stop() == 0  # an open observer does not hold up the stop
    assert time.monotonic() - started < 5 and ended.wait(5)
    assert lines[0] == "retry: 2000" and any(line.startswith("event: state") for line in lines)


# --- access ---------------------------------------------------------------------------------------

TEAM_KEY, OPS_KEY = "team-a-key-7Hq2wZ", "ops-admin-key-Xx93"
ACCESS = f"""
clients:
  - name: team-a
    key: {TEAM_KEY}
    prefixes: ["a/"]
admins:
  - name: ops
    key: {OPS_KEY}
"""


def test_identity_prefixes_apply_to_the_election_name(store_url, lockd_factory, tmp_path, http,
                                                      name):
    (tmp_path / "access.yaml").write_text(ACCESS)
    lockd = lockd_factory(store_url, env={"LOCKD_ACCESS_FILE": str(tmp_path / "access.yaml")})
    url, team, ops = lockd.url, {"Authorization": f"Bearer {TEAM_KEY}"}, {
        "Authorization": f"Bearer {OPS_KEY}"}
    ours, theirs = f"a/{name}", f"b/{name}"
    led = http.post(f"{url}/v1/elections/{theirs}/campaign", headers=ops,
                    json={"ttl_ms": 30_000, "owner": "ops", "value": "v"})
    assert led.status_code == 200, led.text
    lease_id = led.json()["lease_id"]
    before = stable(http.get(f"{url}/v1/elections/{theirs}", headers=ops).json())
    refused = [
        http.post(f"{url}/v1/elections/{theirs}/campaign", headers=team, json={"ttl_ms": 1000}),
        call(http, url, theirs, "renew", headers=team, lease_id=lease_id),
        call(http, url, theirs, "proclaim", headers=team, lease_id=lease_id, value="mine"),
        call(http, url, theirs, "handover", headers=team, lease_id=lease_id, target="x"),
        call(http, url, theirs, "resign", headers=team, lease_id=lease_id),
        http.get(f"{url}/v1/elections/{theirs}", headers=team),
        http.get(f"{url}/v1/elections/{theirs}/observe", headers=team),
    ]
    for r in refused:  # even with the leader's lease id
        body = assert_problem(r, 403, "forbidden_lock")
        assert body["lock"] == theirs and body["identity"] == "team-a"
    after = http.get(f"{url}/v1/elections/{theirs}", headers=ops).json()
    assert stable(after) == before  # nothing changed
    mine = http.post(f"{url}/v1/elections/{ours}/campaign", headers=team,
                     json={"ttl_ms": 30_000, "owner": "team-a"})
    assert mine.status_code == 200, mine.text
    r = call(http, url, ours, "handover", headers=team, lease_id=mine.json()["lease_id"],
             target="next")
    assert r.status_code == 200, r.text
    listed = http.get(f"{url}/v1/elections", headers=team).json()["items"]
    assert [e["election"] for e in listed] == [ours]
    everything = http.get(f"{url}/v1/elections", headers=ops).json()["items"]
    assert sorted(e["election"] for e in everything) == [ours, theirs]


# --- replicas -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["postgres", "etcd"])
def test_two_replicas_share_one_election(kind, request, lockd_factory, http, name):
    """Two lockd processes on one store: an observer at one sees changes made at the other as
    they happen (the store's notification wakes it; heartbeats are 15 s), and a handover asked
    at one reaches the leader renewing at the other, whose queue lets the preferred go first."""
    store_url = request.getfixturevalue("pg_url" if kind == "postgres" else "etcd_url")
    one, two = lockd_factory(store_url), lockd_factory(store_url)
    a = campaign(http, two.url, name, owner="A", value="a1").json()
    results: list = []
    threads = queue_candidates(http, two.url, name, ["B", "C"], results)
    with httpx.stream("GET", f"{one.url}/v1/elections/{name}/observe",
                      timeout=httpx.Timeout(10)) as stream:
        lines, seen = stream.iter_lines(), []
        parse_sse(lines, seen, 1)
        assert seen[0][1] == "state" and seen[0][2]["leader"]["owner"] == "A"
        started = time.monotonic()
        call(http, two.url, name, "proclaim", lease_id=a["lease_id"], value="a2")
        parse_sse(lines, seen, 2)
        assert seen[1][1:] == ("proclaim", {"election": name, "seq": seen[0][0] + 1,
                                            "kind": "proclaim", "owner": "A", "value": "a2",
                                            "fence": a["fence"]})
        assert time.monotonic() - started < 3  # woken by the store, not by a heartbeat
        r = call(http, one.url, name, "handover", target="C", lease_id=a["lease_id"])
        assert r.status_code == 200, r.text
        renewed = call(http, two.url, name, "renew", lease_id=a["lease_id"]).json()
        assert renewed["handover_to"] == "C"
        assert election(http, two.url, name)["waiting_owners"] == ["C", "B"]
        assert call(http, two.url, name, "resign", lease_id=a["lease_id"]).status_code == 200
        threads["C"].join(10)
        c = result(results, "C")
        parse_sse(lines, seen, 4)
        assert [(k, d["owner"]) for _, k, d in seen[2:]] == [("resign", "A"), ("leader", "C")]
        assert seen[3][2]["fence"] == c["fence"] > a["fence"]
    call(http, two.url, name, "resign", lease_id=c["lease_id"])
    threads["B"].join(10)
    assert result(results, "B")["fence"] > c["fence"]
