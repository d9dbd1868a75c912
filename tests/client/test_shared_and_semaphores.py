"""Shared locks and semaphores through both clients (``LockClient``, ``AsyncLockClient``) and their
objects (``client.lock(name, shared=True)``, ``client.semaphore(name, limit, ttl)``), against a
real ``lockd serve`` on SQLite."""

from __future__ import annotations

import threading
import time

import pytest

from harness import wait_for
from lockd import (
    AcquireTimeout,
    LeaseLostError,
    LeaseRef,
    LimitMismatch,
    LockError,
    PermitLease,
    ValidationError,
)
from lockd.client.lease import AsyncLease
from tests.client.both import Both
from tests.jitter import hold_sync


@pytest.fixture
def both(make_api, shared_lockd) -> Both:
    return Both(make_api(shared_lockd.url))


# --------------------------------------------------------------------------- shared locks


def test_shared_leases_coexist_and_keep_the_write_epoch(both, name):
    writer = both("acquire", name, 10)
    writer_fence = writer.fence
    both("release", writer)
    a = both("acquire", name, 10, shared=True, owner="reader-a")
    b = both("acquire", name, 10, shared=True, owner="reader-b")
    assert (a.mode, b.mode) == ("shared", "shared")
    assert a.fence == b.fence == writer_fence        # the write epoch, not raised
    assert a.as_dict()["mode"] == "shared" and "mode" not in writer.as_dict()
    status = both("status", name)
    assert status.held and status.mode == "shared"
    assert sorted((h.owner, h.mode) for h in status.holders) == [("reader-a", "shared"),
                                                                ("reader-b", "shared")]
    assert status.to_json()["mode"] == "shared"
    assert both("try_acquire", name, 10) is None     # an exclusive waits for every reader
    both("release", a)
    assert both("try_acquire", name, 10) is None     # b still reads
    both("release", b)
    again = both("acquire", name, 10, wait=5)
    assert again.mode == "exclusive" and again.fence > writer_fence
    both("release", again)


def test_a_shared_request_waits_while_an_exclusive_one_holds(both, name):
    writer = both("acquire", name, 10)
    started = time.monotonic()
    assert both("try_acquire", name, 10, wait=0.3, shared=True) is None
    assert time.monotonic() - started >= 0.25
    with pytest.raises(AcquireTimeout):
        both("acquire", name, 10, wait=0.2, shared=True)
    both("release", writer)
    reader = both("acquire", name, 10, shared=True, wait=5)
    assert reader.fence == writer.fence
    both("release", reader)


def test_a_shared_lease_is_renewed_in_the_background(both, name):
    ttl = 0.6
    lease = both("acquire", name, ttl, shared=True)
    time.sleep(2 * ttl)  # proves: renewed in the background across two TTLs
    assert not both.is_set(lease.lost)
    assert both("status", name).mode == "shared"
    both("release", lease)
    assert not both("status", name).held


def test_the_lock_object_in_shared_mode(both, name):
    r1 = both.make("lock", name, 10, shared=True, owner="r1")
    r2 = both.make("lock", name, 10, shared=True, owner="r2")
    assert r1.shared and repr(getattr(r1, "_target", r1)).endswith(", shared, not held)")
    assert r1.acquire(blocking=False) and r2.acquire(blocking=False)
    assert r1.lease.mode == "shared" and r1.fence == r2.fence
    assert r1.owned() and both.wait(r1.owned(check=True)) and r1.locked()
    assert r1.lost is not None and not r1.lost.is_set()
    with pytest.raises(LockError):
        r1.acquire(blocking=False)                   # not re-entrant
    w = both.make("lock", name, 10, owner="w")
    assert w.acquire(blocking=True, timeout=0.2) is False
    r1.release()
    assert r1.token is None and r1.lost is None and not r1.owned()
    r2.release()
    assert w.acquire(blocking=True, timeout=5) is True
    assert r1.acquire(blocking=True, timeout=0.2) is False
    w.release()
    with both.make("lock", name, 10, shared=True, wait=5) as lease:
        assert lease.mode == "shared"
    assert not both("status", name).held


def test_owned_check_of_a_shared_lock_sees_an_ended_lease(both, name):
    reader = both.make("lock", name, 30, shared=True, owner="r")
    assert reader.acquire(blocking=False)
    both("release", LeaseRef(name, reader.lease.lease_id))   # ended behind its back
    assert reader.owned() and not both.wait(reader.owned(check=True))
    with pytest.raises(LeaseLostError):
        reader.release()


def test_a_multi_lock_set_may_hold_some_locks_shared(both, name):
    common, mine, theirs = f"{name}/common", f"{name}/mine", f"{name}/theirs"
    a = both("acquire_many", [common, mine], 10, shared=[common])
    b = both("acquire_many", [common, theirs], 10, shared=[common], wait=5)   # coexists on common
    assert a.modes == {common: "shared", mine: "exclusive"}
    assert a.as_dict()["modes"][common] == "shared" and a.fences[common] == b.fences[common]
    assert both("try_acquire", common, 10) is None   # a writer waits for both sets
    assert both("try_acquire_many", [mine], 10) is None
    with pytest.raises(ValidationError):
        both("acquire_many", [mine], 10, shared=[theirs])   # not in the set: refused locally
    both("release", a)
    both("release", b)
    plain = both("acquire_many", [common, mine], 10)
    assert set(plain.modes.values()) == {"exclusive"} and "modes" not in plain.as_dict()
    both("release", plain)


# --------------------------------------------------------------------------- semaphores


def test_permits_up_to_the_limit_each_with_a_slot_and_a_rising_fence(both, name):
    p0 = both("acquire_permit", name, 2, 10, owner="a")
    p1 = both("acquire_permit", name, 2, 10, owner="b")
    assert (p0.slot, p1.slot) == (0, 1) and p1.fence > p0.fence
    assert p0.lock == f"sem/{name}/0" and p0.semaphore == name and p0.limit == 2
    assert set(p0.as_dict()) >= {"semaphore", "slot", "limit", "lock", "fence", "token"}
    assert "lease_id=<hidden>" not in repr(p0) and p0.lease_id not in repr(p0)
    assert both("try_acquire_permit", name, 2, 10) is None
    with pytest.raises(AcquireTimeout) as caught:
        both("acquire_permit", name, 2, 10, wait=0.2)
    assert "full" in str(caught.value) and "'a'" in str(caught.value)
    status = both("semaphore_status", name)
    assert (status.limit, status.available) == (2, 0)
    assert [(p.slot, p.owner, p.fence) for p in status.permits] == [(0, "a", p0.fence),
                                                                    (1, "b", p1.fence)]
    with pytest.raises(LimitMismatch) as mismatch:
        both("try_acquire_permit", name, 3, 10)
    assert mismatch.value.limit == 2
    both("release", p0)
    p2 = both("acquire_permit", name, 2, 10, wait=5)
    assert p2.slot == 0 and p2.fence > p1.fence      # the freed slot, a new fence
    both("release", p1)
    both("release", p2)
    assert both("semaphore_status", name).permits == ()


def test_a_waiting_permit_is_granted_when_one_is_released(both, name):
    held = both("acquire_permit", name, 1, 10)
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(
        both("acquire_permit", name, 1, 10, wait=20)))
    waiter.start()
    wait_for(lambda: both("semaphore_status", name).waiters == 1, what="the waiter queued")
    released_at = time.monotonic()
    both("release", held)
    waiter.join(20)
    assert got and got[0].slot == 0 and got[0].fence > held.fence
    assert time.monotonic() - released_at < 2        # woken by the release, not by polling
    both("release", got[0])


def test_a_permit_is_renewed_and_lost_when_lockd_ends_it(both, name):
    ttl = 0.6
    permit = both("acquire_permit", name, 3, ttl)
    time.sleep(2 * ttl)  # proves: renewed in the background across two TTLs
    assert not both.is_set(permit.lost)
    assert ("POST", f"/v1/semaphores/{name}/renew") in both.api.requests
    both("release", LeaseRef(name, permit.lease_id, kind="semaphore"))
    with pytest.raises(LeaseLostError):
        both.wait(permit.renew())
    assert both.wait_event(permit.lost, 5)
    with pytest.raises(LeaseLostError):
        both("release", permit)


def test_a_permit_by_reference_renews_and_releases(both, name):
    permit = both("acquire_permit", name, 1, 10, auto_renew=False)
    ref = permit.ref()
    assert ref.kind == "semaphore" and "kind='semaphore'" in repr(ref)
    renewed = both("renew", ref, ttl=20)
    assert isinstance(renewed, PermitLease) or type(renewed).__name__ == "AsyncPermitLease"
    assert renewed.slot == permit.slot and renewed.ttl == 20
    both("release", ref)
    assert both("semaphore_status", name).permits == ()


def test_the_semaphore_object(both, name):
    sem = both.make("semaphore", name, 2, 10, owner="s1")
    other = both.make("semaphore", name, 2, 10, owner="s2")
    assert sem.slot is None and sem.fence is None
    assert sem.acquire() is True and sem.slot == 0
    assert not sem.locked()                          # one permit is still free
    assert other.acquire(blocking=False) and other.slot == 1
    assert sem.locked() and both.wait(sem.owned(check=True))
    assert sem.status().available == 0
    third = both.make("semaphore", name, 2, 10)
    assert third.acquire(blocking=True, timeout=0.2) is False
    with pytest.raises(LockError):
        sem.acquire()
    sem.release()
    assert sem.slot is None and not sem.owned()
    with third as permit:                            # yields the permit's lease
        assert permit.slot == 0 and permit.semaphore == name
        assert both.wait(third.owned(check=True))
    other.release()
    assert both("semaphore_status", name).permits == ()


def test_bad_semaphore_arguments_are_refused(both, name):
    with pytest.raises(TypeError):
        both("acquire_permit", name, "2", 10)
    with pytest.raises(ValidationError):
        both("acquire_permit", name, 0, 10)          # lockd's range: 1-10000
    with pytest.raises(ValidationError):
        both("acquire_permit", "a//b", 2, 10)
    assert both("semaphore_status", name).limit == 0


def test_never_more_than_limit_permits_among_racing_holders(make_api, shared_lockd, name):
    limit, workers, rounds = 3, 8, 4
    apis = [Both(make_api(shared_lockd.url)) for _ in range(workers)]
    inside = 0
    most = 0
    mutex = threading.Lock()
    errors: list[BaseException] = []
    slots_seen: set[int] = set()

    def work(b: Both) -> None:
        nonlocal inside, most
        try:
            for _ in range(rounds):
                permit = b("acquire_permit", name, limit, 10, wait=30)
                with mutex:
                    inside += 1
                    most = max(most, inside)
                    slots_seen.add(permit.slot)
                hold_sync(None, 0.02)
                with mutex:
                    inside -= 1
                b("release", permit)
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(b,)) for b in apis]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert 1 < most <= limit and slots_seen <= set(range(limit))


def test_async_permits_are_async_leases(make_api, shared_lockd, name):
    b = Both(make_api(shared_lockd.url))
    permit = b("acquire_permit", name, 1, 10)
    assert isinstance(permit, AsyncLease) == b.is_async
    b("release", permit)
