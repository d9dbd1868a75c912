"""Elections through both clients (``LockClient``, ``AsyncLockClient``) and their ``Election`` /
``AsyncElection`` objects, against a real ``lockd serve`` on SQLite: campaign, proclaim, resign,
``lead()``, lost, graceful handover, and ``observe`` in order and resumed after lockd restarts."""

from __future__ import annotations

import base64
import json
import threading
import time

import pytest

from harness import wait_for
from lockd import (
    AcquireTimeout,
    ElectionEvent,
    LeaseLostError,
    LeaseRef,
    LockClient,
    LockError,
    ValidationError,
)
from lockd.client.primitives import ObserveCursor
from lockd.client.wire import SseEvent, SseParser
from tests.client.both import Both


@pytest.fixture
def both(make_api, shared_lockd) -> Both:
    return Both(make_api(shared_lockd.url))


def _claims(token: str) -> dict:
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def test_campaign_proclaim_resign_and_the_next_term(both, name):
    a = both.make("election", name, value="host-a", owner="a")
    b = both.make("election", name, value="host-b", owner="b")
    assert not a.is_leader and a.fence is None and a.leader().leader is None
    assert a.campaign() is True and a.is_leader
    assert a.lease.lock == name and _claims(a.token)["lock"] == name
    status = a.leader()
    assert (status.leader, status.value, status.fence) == ("a", "host-a", a.fence)
    assert b.campaign(blocking=False) is False
    assert b.campaign(timeout=0.2) is False and not b.is_leader
    assert b.locked() and both.wait(a.owned(check=True))
    fence = a.fence
    seq = a.proclaim("host-a:9090")
    assert seq > 0 and a.value == "host-a:9090" and a.fence == fence   # same term
    assert b.leader().value == "host-a:9090"
    a.resign()
    assert not a.is_leader and a.token is None
    assert b.campaign(timeout=5) is True and b.fence > fence           # a new term
    assert b.leader().value == "host-b"
    with pytest.raises(LockError):
        a.proclaim("not leading")
    b.resign()
    assert not b.locked()


def test_campaign_times_out_naming_the_election(both, name):
    leader = both("campaign", name, "v", 10, owner="first")
    with pytest.raises(AcquireTimeout) as caught:
        both("campaign", name, "w", 10, wait=0.2)
    assert f"election {name!r}" in str(caught.value) and "first" in str(caught.value)
    assert both("try_campaign", name, "w", 10) is None
    both("resign", leader)


def test_lead_blocks_until_leading_and_resigns_on_exit(both, make_api, shared_lockd, name):
    holder = LockClient(shared_lockd.url)
    first = holder.campaign(name, "first", 10, owner="first")
    led: list[int] = []
    follower = both.make("election", name, value="second", owner="second", wait=20)

    def second() -> None:
        with both.obj(follower.lead()) as election:   # async: ``async with`` on the loop
            assert getattr(follower, "_target", follower) is election
            led.append(follower.fence)
            assert follower.leader().leader == "second"

    thread = threading.Thread(target=second)
    thread.start()
    wait_for(lambda: holder.leader(name).waiters == 1, what="the second candidate waiting")
    assert not led
    holder.resign(first)
    thread.join(20)
    holder.close()
    assert led and led[0] > first.fence
    assert both("leader", name).leader is None       # resigned when the block ended


def test_a_leader_whose_lease_ends_is_told_it_lost(both, shared_lockd, name):
    lost: list = []
    election = both.make("election", name, ttl=0.6, on_lost=lost.append)
    assert election.campaign()
    both("resign", LeaseRef(name, election.lease.lease_id, kind="election"))  # behind its back
    assert both.wait_event(election.lost, 5)       # the next renewal gets 410
    wait_for(lambda: lost, what="on_lost")
    assert not election.is_leader
    with pytest.raises(LeaseLostError):
        election.proclaim("too late")
    with pytest.raises(LeaseLostError):
        election.resign()


def test_handover_calls_back_then_resigns_and_the_preferred_candidate_leads(both, make_api,
                                                                            shared_lockd, name):
    called: list[tuple[str, str]] = []
    # a TTL a loaded machine's stall cannot outlast: a lost lease would let "c" lead at once
    leader = both.make("election", name, value="a", owner="a", ttl=3.0,
                       on_handover=lambda lease, target: called.append((lease.owner, target)))
    assert leader.campaign()
    other = Both(make_api(shared_lockd.url))
    got: list = []
    threads = [threading.Thread(target=lambda o=o: got.append(
        other("campaign", name, o, 10, owner=o, wait=20))) for o in ("c", "b")]
    for queued, t in enumerate(threads, 1):          # "c" queues first, then "b"
        t.start()
        wait_for(lambda n=queued: both("leader", name).waiters >= n, what="candidates waiting")
    fence = leader.fence
    assert leader.handover("b") == "b"               # the leader asks for itself
    assert both.wait_event(leader.handover_requested, 5)
    wait_for(lambda: got, timeout=10, what="the preferred candidate leading")
    assert called == [("a", "b")]
    assert got[0].owner == "b" and got[0].fence > fence   # preferred over "c", a new term
    assert not leader.is_leader and leader.fence is None and leader.token is None
    status = both("leader", name)
    assert status.leader == "b" and status.handover_to is None
    other("resign", got[0])
    for t in threads:
        t.join(20)
    other("resign", got[1])


def test_a_handover_callback_that_hangs_is_cut_short_by_the_grace(both, name):
    gate = threading.Event()

    def slow(lease, target):
        if both.is_async:
            async def forever():
                await __import__("asyncio").Event().wait()  # hangs until cancelled
            return forever()
        gate.wait(60)
        return None

    leader = both.make("election", name, owner="slow", ttl=0.9, on_handover=slow,
                       handover_grace=0.5)
    assert leader.campaign()
    asked = time.monotonic()
    leader.handover("next")
    wait_for(lambda: both("leader", name).leader is None, timeout=10, what="the resign")
    assert time.monotonic() - asked < 0.3 + 0.5 + 2  # a renewal, the grace, some slack
    gate.set()


def test_observe_replays_the_log_in_order_from_a_seq(both, name):
    actor = both.make("election", name, value="v1", owner="x")
    assert actor.campaign()
    actor.proclaim("v2")
    actor.resign()
    events = both.collect(both.api.client.observe(name, last_event_id=0), 3)
    assert [(e.kind, e.owner, e.value) for e in events] == [
        ("leader", "x", "v1"), ("proclaim", "x", "v2"), ("resign", "x", "")]
    assert [e.seq for e in events] == [1, 2, 3] and events[0].fence == events[1].fence
    assert all(isinstance(e, ElectionEvent) and e.election == name for e in events)


def test_observe_starts_with_the_state_then_streams_changes(both, shared_lockd, name):
    actor = LockClient(shared_lockd.url)
    first = actor.campaign(name, "one", 10, owner="p")
    events: list = []

    def act() -> None:
        wait_for(lambda: events, timeout=20, what="the observer's first (state) event")
        actor.proclaim(first, "two")
        actor.resign(first)
        second = actor.campaign(name, "three", 10, owner="q")
        actor.resign(second)

    acting = threading.Thread(target=act)
    acting.start()
    both.collect(both.make("election", name).observe(), 5, into=events)
    acting.join(20)
    actor.close()
    assert [(e.kind, e.owner, e.value) for e in events] == [
        ("state", "p", "one"), ("proclaim", "p", "two"), ("resign", "p", ""),
        ("leader", "q", "three"), ("resign", "q", "")]
    seqs = [e.seq for e in events]
    assert seqs == list(range(seqs[0], seqs[0] + 5))
    assert events[3].fence > events[0].fence


def test_observe_resumes_after_lockd_restarts_without_gaps_or_repeats(make_api, lockd_server,
                                                                       name):
    both = Both(make_api(lockd_server.url))
    actor = LockClient(lockd_server.url)
    lease = actor.campaign(name, "before", 30, owner="r", auto_renew=False)
    got: list[ElectionEvent] = []
    done = threading.Event()

    def observe() -> None:
        both.collect(both.api.client.observe(name), 4, timeout=60, into=got)
        done.set()

    threading.Thread(target=observe).start()
    wait_for(lambda: got, what="the stream's first (state) event")
    lockd_server.restart()                           # the same store: the log survives
    actor.proclaim(lease, "after")
    actor.resign(lease)
    lease2 = actor.campaign(name, "next", 30, owner="s", auto_renew=False)
    assert done.wait(60), got
    actor.resign(lease2)
    actor.close()
    assert [(e.kind, e.value) for e in got] == [("state", "before"), ("proclaim", "after"),
                                                 ("resign", ""), ("leader", "next")]
    assert [e.seq for e in got] == list(range(got[0].seq, got[0].seq + 4))
    assert both.api.requests[("GET", f"/v1/elections/{name}/observe")] >= 2  # reconnected


def test_bad_election_input_is_refused_before_or_by_lockd(both, name):
    with pytest.raises(TypeError):
        both("campaign", name, 42, 10)
    with pytest.raises(ValidationError):
        both("campaign", name, "x" * 5000, 10)       # over 4096 bytes
    with pytest.raises(ValidationError):
        both("leader", "a/../b")
    assert both("leader", name).leader is None


# --------------------------------------------------------------------------- the resume rule


def _sse(kind: str, seq: int, **data) -> SseEvent:
    return SseEvent(kind, str(seq), {"seq": seq, **data})


def test_the_observe_cursor_skips_what_it_has_seen_and_takes_a_newer_state():
    cursor = ObserveCursor("e")
    assert cursor.headers() == {}
    state = cursor.take(SseEvent("state", "4", {"seq": 4, "leader": {"owner": "a"},
                                                "value": "v", "fence": 3}))
    assert (state.kind, state.owner, state.seq) == ("state", "a", 4)
    assert cursor.headers() == {"Last-Event-ID": "4"}
    assert cursor.take(_sse("proclaim", 4, owner="a")) is None     # a repeat
    assert cursor.take(_sse("resign", 5, owner="a")).seq == 5
    assert cursor.take(SseEvent("state", "5", {"seq": 5, "leader": None})) is None
    newer = cursor.take(SseEvent("state", "9", {"seq": 9, "leader": None}))
    assert newer is not None and newer.owner is None   # the log lost 6..8: the state says now
    assert cursor.take(SseEvent("overflow", None, {"dropped": 1})) is None
    assert [cursor.pause() for _ in range(3)] == [0.05, 0.1, 0.2]


def test_the_sse_parser_reads_ids_types_and_skips_comments():
    parser = SseParser()
    lines = ["retry: 2000", ": connected", "", "id: 7", "event: leader",
             'data: {"seq": 7, "owner": "a"}', ""]
    events = [e for e in map(parser.feed, lines) if e is not None]
    assert events == [SseEvent("leader", "7", {"seq": 7, "owner": "a"})]
