"""Waiting for multi-lock leases: FIFO without barging, no starvation, and what holds across
replicas (two lockd processes on one PostgreSQL database). Real servers, real races."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from harness import TIMING_SLACK
from tests.jitter import hold_sync
from tests.server.calls import acquire, release, state, wait_until
from tests.server.test_multi_lock import acquire_many, fences, release_many


@pytest.fixture
def sqlite_lockd(lockd_factory, tmp_path: Path):
    return lockd_factory(f"sqlite:///{tmp_path}/waiting.db")


def _in_thread(fn, *args) -> tuple[threading.Thread, list]:
    out: list = []

    def run() -> None:
        with httpx.Client(timeout=60) as c:
            out.append((fn(c, *args), time.monotonic()))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_later_requests_do_not_barge_ahead_of_a_queued_set(sqlite_lockd, http, name):
    url = sqlite_lockd.url
    a, b = f"{name}/a", f"{name}/b"
    holder = acquire(http, url, a, owner="holder").json()
    t_set, got_set = _in_thread(lambda c: acquire_many(c, url, [a, b], wait_ms=20_000,
                                                       owner="set"))
    wait_until(lambda: state(http, url, b)["waiters"] == 1, what="set queued on b")
    # b is free, yet a single waiter on b and a later set on [b] queue behind the first set.
    t_single, got_single = _in_thread(lambda c: acquire(c, url, b, wait_ms=20_000,
                                                        owner="single"))
    wait_until(lambda: state(http, url, b)["waiters"] == 2, what="single queued on b")
    t_set2, got_set2 = _in_thread(lambda c: acquire_many(c, url, [b], wait_ms=20_000,
                                                         owner="set2"))
    wait_until(lambda: state(http, url, b)["waiters"] == 3, what="second set queued on b")
    time.sleep(0.2)  # proves: b stays free and ungranted while the set waits for a (200 ms)
    assert not got_single and not got_set2 and not state(http, url, b)["held"]
    # Three acquires wait (the first set is queued on two locks but counts once).
    assert "lockd_acquires_waiting 3.0" in http.get(f"{url}/metrics").text

    release(http, url, a, holder["lease_id"])
    t_set.join(10)
    (r, _), = got_set
    assert r.status_code == 200, r.text
    # the store's word: the set holds b, the single waiter and the second set still queue
    b_now = state(http, url, b)
    assert (b_now["owner"], b_now["waiters"]) == ("set", 2), b_now
    assert not got_single, "the single waiter barged ahead of nothing: the set holds b"
    release_many(http, url, r.json()["lease_id"])
    t_single.join(10)
    (s, _), = got_single
    assert s.status_code == 200 and s.json()["owner"] == "single", s.text
    b_now = state(http, url, b)
    assert (b_now["owner"], b_now["waiters"]) == ("single", 1), b_now
    assert not got_set2  # still behind the single lease
    release(http, url, b, s.json()["lease_id"])
    t_set2.join(10)
    (r2, _), = got_set2
    assert r2.status_code == 200 and fences(r2.json())[b] > s.json()["fence"]


def test_a_set_is_not_starved_by_single_lock_clients_taking_its_locks_in_turn(
        sqlite_lockd, http, name):
    url = sqlite_lockd.url
    x, y = f"{name}/x", f"{name}/y"
    stop = threading.Event()
    grants = {x: 0, y: 0}
    overlap: list[str] = []

    def churn(lock: str, offset: float) -> None:
        # Two of these per lock: whenever one releases, the other is already queued, so the lock
        # is never free for an instant and x and y are rarely free together.
        hold_sync(None, offset)
        with httpx.Client(timeout=30) as c:
            while not stop.is_set():
                r = acquire(c, url, lock, 5000, wait_ms=10_000, owner="churn")
                if r.status_code != 200:
                    continue
                grants[lock] += 1
                hold_sync(None, 0.03)
                release(c, url, lock, r.json()["lease_id"])

    threads = [threading.Thread(target=churn, args=(lock, i * 0.013), daemon=True)
               for lock in (x, y) for i in range(2)]
    for t in threads:
        t.start()
    wait_until(lambda: grants[x] > 5 and grants[y] > 5, timeout=10, what="churn running")
    before = dict(grants)
    started = time.monotonic()
    r = acquire_many(http, url, [x, y], 5000, wait_ms=15_000, owner="set")
    waited = time.monotonic() - started
    assert r.status_code == 200, r.text
    # Granted once the holders ahead of it in each queue had their turn (a few 30 ms holds).
    assert waited < 2.0 * TIMING_SLACK, f"the set waited {waited:.2f} s"
    for lock in (x, y):
        s = state(http, url, lock)
        if not (s["held"] and s["owner"] == "set"):
            overlap.append(lock)
    held_counts = dict(grants)
    time.sleep(0.2)  # proves: no single-lock client gets x or y while the set holds them (200 ms)
    assert grants == held_counts, "a single-lock client was granted a lock the set holds"
    release_many(http, url, r.json()["lease_id"])
    wait_until(lambda: grants[x] > held_counts[x] and grants[y] > held_counts[y],
               what="churn resumed after the set")
    stop.set()
    for t in threads:
        t.join(15)
    assert not overlap
    assert before[x] > 5 and before[y] > 5


# --- across replicas: two lockd on one PostgreSQL ------------------------------------------------


def test_two_replicas_wake_a_waiting_set_on_release_and_never_deadlock(lockd_factory, pg_url,
                                                                       http, name):
    one, two = lockd_factory(pg_url), lockd_factory(pg_url)
    a, b = f"{name}/a", f"{name}/b"
    # A set waiting at one replica is woken by a release at the other (NOTIFY), not its TTL.
    holder = acquire(http, two.url, a, 20_000, owner="holder").json()
    t, got = _in_thread(lambda c: acquire_many(c, one.url, [a, b], 20_000, wait_ms=15_000))
    wait_until(lambda: state(http, one.url, a)["waiters"] == 1, what="set queued at one")
    assert not state(http, two.url, b)["held"]  # it holds nothing while it waits
    released = time.monotonic()
    release(http, two.url, a, holder["lease_id"])
    t.join(10)
    (r, granted_at), = got
    assert r.status_code == 200, r.text
    assert granted_at - released < 2.0 * TIMING_SLACK  # the holder had 20 s left
    release_many(http, one.url, r.json()["lease_id"])

    # Opposite orders at two replicas, each set waiting at its own: every cycle completes and
    # the holders never overlap (PostgreSQL locks rows in name order in every transaction).
    inside = threading.Lock()
    overlaps: list[int] = []
    done = [0, 0]

    def cycle(index: int, url: str, locks: list[str]) -> None:
        with httpx.Client(timeout=30) as c:
            for _ in range(40):
                r = acquire_many(c, url, locks, 5000, wait_ms=10_000)
                assert r.status_code == 200, r.text
                if not inside.acquire(blocking=False):
                    overlaps.append(index)
                else:
                    hold_sync(None, 0.002)  # "inside" while holding both locks
                    inside.release()
                release_many(c, url, r.json()["lease_id"])
                done[index] += 1

    threads = [threading.Thread(target=cycle, args=(0, one.url, [a, b]), daemon=True),
               threading.Thread(target=cycle, args=(1, two.url, [b, a]), daemon=True)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert done == [40, 40] and not overlaps


def test_a_waiting_set_whose_client_goes_away_leaves_every_queue(sqlite_lockd, http, name):
    url = sqlite_lockd.url
    a, b = f"{name}/a", f"{name}/b"
    holder = acquire(http, url, a, owner="holder").json()
    with httpx.Client(timeout=0.5) as impatient, pytest.raises(httpx.ReadTimeout):
        acquire_many(impatient, url, [a, b], wait_ms=20_000)
    wait_until(lambda: state(http, url, a)["waiters"] == 0 and state(http, url, b)["waiters"] == 0,
               what="the set left both queues")
    # Nothing was granted behind anyone's back: b is free and a single acquire gets it at once.
    r = acquire(http, url, b, owner="next")
    assert r.status_code == 200, r.text
    release(http, url, a, holder["lease_id"])
    time.sleep(0.2)  # proves: the departed set is not granted a after the release (200 ms)
    assert not state(http, url, a)["held"]  # the departed set was not granted a
