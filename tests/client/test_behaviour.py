"""The client's behaviour against a real lockd, run with ``LockClient`` and ``AsyncLockClient``,
each through its lease API (``sync``, ``async``) and through the reusable ``Lock`` object
``client.lock(...)`` returns (``sync-lock``, ``async-lock``; see ``tests.client.adapters``)."""

from __future__ import annotations

import threading
import time

import pytest

from harness import free_port, wait_for
from lockd import (
    AcquireTimeout,
    LeaseLostError,
    LeaseRef,
    LeaseState,
    ServiceUnavailable,
    TransportError,
    ValidationError,
)
from tests.client.conftest import api_maker


@pytest.fixture(params=["sync", "async", "sync-lock", "async-lock"])
def make_api(request):
    """This suite judges the lease API and the Lock object, of both clients."""
    make = api_maker(request.param)
    yield make
    make.close()


@pytest.fixture
def api(make_api, shared_lockd):
    return make_api(shared_lockd.url)


@pytest.fixture
def other(make_api, shared_lockd):
    """A second, independent client of the same kind (another holder)."""
    return make_api(shared_lockd.url)


def test_try_acquire_returns_a_lease_or_none(api, other, name):
    lease = api.try_acquire(name, 2.0, owner="first")
    assert lease is not None and lease.lock == name and lease.fence >= 1
    assert lease.state is LeaseState.HELD and not lease.lost.is_set()
    assert lease.token.count(".") == 2 and lease.ttl == 2.0 and lease.owner == "first"
    assert lease.lease_id not in repr(lease) and lease.token not in repr(lease)
    assert other.try_acquire(name, 2.0) is None
    api.release(lease)
    assert lease.state is LeaseState.RELEASED and not lease.lost.is_set()
    again = other.try_acquire(name, 2.0)
    assert again is not None and again.fence > lease.fence
    other.release(again)


def test_acquire_raises_timeout_after_wait(api, other, name):
    holder = other.acquire(name, 5.0, owner="the-holder")
    t0 = time.monotonic()
    with pytest.raises(AcquireTimeout) as info:
        api.acquire(name, 1.0, wait=0.4)
    elapsed = time.monotonic() - t0
    assert 0.35 <= elapsed < 3.0
    assert info.value.owner == "the-holder" and info.value.lock == name
    assert info.value.waited >= 0.35
    assert api.status(name).fence == holder.fence  # nothing was granted meanwhile
    other.release(holder)


def test_acquire_waits_until_the_holder_releases(api, other, name):
    holder = other.acquire(name, 5.0)
    threading.Timer(0.3, other.release, args=(holder,)).start()
    t0 = time.monotonic()
    lease = api.acquire(name, 2.0, wait=5.0)
    assert 0.2 <= time.monotonic() - t0 < 3.0
    assert lease.fence > holder.fence
    api.release(lease)


def test_local_deadline_counts_from_before_the_request(api, other, name):
    """The grant happens ~0.5 s into a waiting acquire; the deadline still counts from before
    the request was sent (conservative), never from when the answer arrived."""
    holder = other.acquire(name, 5.0)
    threading.Timer(0.5, other.release, args=(holder,)).start()
    t0 = time.monotonic()
    lease = api.acquire(name, 3.0, wait=5.0, auto_renew=False)
    assert time.monotonic() - t0 >= 0.4
    assert t0 + 3.0 <= lease.deadline <= t0 + 3.0 + 0.05
    api.release(lease)


def test_a_grant_after_waiting_longer_than_the_ttl_is_renewed_not_born_lost(api, other, name):
    """Waiting 1.2 s for a 0.6 s lease: the conservative deadline (sent + ttl) has passed when
    the grant arrives, so the client renews at once and counts from that renewal instead of
    handing back a lease that is already lost."""
    holder = other.acquire(name, 5.0)
    threading.Timer(1.2, other.release, args=(holder,)).start()
    t0 = time.monotonic()
    lease = api.acquire(name, 0.6, wait=5.0, auto_renew=False)
    t1 = time.monotonic()
    assert t1 - t0 >= 1.1
    assert lease.state is not LeaseState.LOST and not lease.lost.is_set()
    # counted from the renewal's send time (after the 1.2 s wait), not the acquire's (t0); how
    # long the renewal took to answer is the machine's load, not the rule
    assert t0 + 1.1 <= lease.deadline - 0.6 <= t1
    api.release(lease)
    assert lease.state is LeaseState.RELEASED


def test_wait_longer_than_lockds_cap_is_split_into_capped_requests(api, other, name):
    # lockd rejects wait_ms > 300000 with 422: this succeeds only because the client caps it.
    holder = other.acquire(name, 5.0)
    threading.Timer(0.3, other.release, args=(holder,)).start()
    lease = api.acquire(name, 2.0, wait=1000.0)
    assert lease.fence > holder.fence
    api.release(lease)
    holder2 = other.acquire(name, 5.0)
    threading.Timer(0.3, other.release, args=(holder2,)).start()
    lease = api.acquire(name, 2.0, wait=None)  # forever
    assert lease.fence > holder2.fence
    api.release(lease)


def test_failed_acquire_never_runs_the_block(api, other, name):
    holder = other.acquire(name, 5.0)
    ran = []
    with pytest.raises(AcquireTimeout):
        with api.lock(name, 1.0, wait=0.2):
            ran.append(True)
    assert ran == []
    status = api.status(name)
    assert status.held and status.fence == holder.fence
    other.release(holder)


def test_exception_in_the_block_releases_the_lock(api, other, name):
    with pytest.raises(ZeroDivisionError):
        with api.lock(name, 5.0) as lease:
            assert api.status(name).held
            1 / 0  # noqa: B018
    assert lease.state is LeaseState.RELEASED and not lease.lost.is_set()
    assert not api.status(name).held
    taken = other.try_acquire(name, 1.0)  # free at once, not after the 5 s TTL
    assert taken is not None and taken.fence > lease.fence
    other.release(taken)


def test_normal_exit_releases_the_lock(api, name):
    with api.lock(name, 5.0, wait=1.0) as lease:
        assert api.status(name).held
    assert lease.state is LeaseState.RELEASED
    assert not api.status(name).held


def test_renewal_every_third_of_ttl_keeps_the_lease_over_several_ttls(api, other, name):
    lost = []
    ttl = 0.6
    lease = api.acquire(name, ttl, on_lost=lost.append)
    time.sleep(4 * ttl)  # proves: renewals alone keep the lease over four TTLs
    status = api.status(name)
    assert status.held and status.fence == lease.fence
    assert lease.state is LeaseState.RENEWED and not lease.lost.is_set() and lost == []
    assert other.try_acquire(name, 0.5) is None
    renewals = api.renew_count(name)
    assert 7 <= renewals <= 14, renewals  # every 0.2 s -> about 12
    api.release(lease)
    assert lost == []


def test_renewal_period_is_configurable(api, name):
    lease = api.acquire(name, 1.5, renew_every=0.1)
    # within 1.2 s: ttl/3 would have renewed twice
    wait_for(lambda: api.renew_count(name) >= 7, timeout=1.2, what="7 renewals 0.1 s apart")
    api.release(lease)
    with pytest.raises(ValueError):
        api.acquire(name, 1.0, renew_every=1.0)


def test_manual_renew_keeps_the_fence_and_extends(api, name):
    lease = api.acquire(name, 1.0, auto_renew=False)
    before = lease.deadline
    assert api.renew(lease, ttl=3.0) is lease
    assert lease.fence == api.status(name).fence and lease.ttl == 3.0
    assert lease.state is LeaseState.RENEWED and lease.deadline > before + 2
    assert api.status(name).ttl > 2.0
    api.release(lease)


def test_410_marks_the_lease_lost_once_and_the_block_exit_raises(api, other, name):
    calls = []
    with pytest.raises(LeaseLostError):
        with api.lock(name, 1.2, on_lost=calls.append) as lease:
            # Someone else ends the lease (an operator with the lease id): the next renewal
            # gets 410 from lockd.
            other.release(LeaseRef(name, lease.lease_id))
            assert api.wait_lost(lease, 2.0)
            assert lease.state is LeaseState.LOST
            assert lease.lost_reason.code == "lease_lost" and lease.lost_reason.status == 410
            with pytest.raises(LeaseLostError):
                lease.check()
    assert calls == [lease]  # exactly once, though the exit's release also saw the loss
    assert lease.state is LeaseState.LOST


def test_a_lost_lease_is_never_renewed_back(api, other, name):
    lease = api.acquire(name, 1.0, auto_renew=False)
    other.release(LeaseRef(name, lease.lease_id))
    with pytest.raises(LeaseLostError):
        api.renew(lease)
    assert lease.is_lost() and api.wait_lost(lease, 1.0)
    with pytest.raises(LeaseLostError):
        api.renew(lease)
    with pytest.raises(LeaseLostError):
        api.release(lease)


def test_status_and_listing(api, name):
    assert api.status(name).held is False
    a = api.acquire(name + "/a", 5.0, owner="me")
    b = api.acquire(name + "/b", 5.0)
    st = api.status(name + "/a")
    assert st.held and st.owner == "me" and st.fence == a.fence and 0 < st.ttl <= 5.0
    listed = api.locks(name + "/")
    assert [s.lock for s in listed] == [name + "/a", name + "/b"]
    assert [s.lock for s in api.locks(name + "/", page_size=1)] == [name + "/a", name + "/b"]
    assert len(api.locks(name + "/", limit=1)) == 1
    api.release(a)
    api.release(b)


def test_bad_input_is_a_validation_error(api, name):
    with pytest.raises(ValidationError) as info:
        api.try_acquire("bad name!", 1.0)
    assert info.value.status == 422
    with pytest.raises(ValidationError):
        api.try_acquire(name, 0.001)  # below lockd's minimum TTL
    with pytest.raises(ValueError):
        api.try_acquire(name, -1.0)


def test_unreachable_lockd_is_service_unavailable(make_api, name):
    api = make_api(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(TransportError):
        api.try_acquire(name, 1.0)
    t0 = time.monotonic()
    with pytest.raises(ServiceUnavailable):
        api.acquire(name, 1.0, wait=0.5)  # retried within the wait, then raised
    assert 0.4 <= time.monotonic() - t0 < 3.0


# ------------------------------------------------------------------ lockd itself fails


def _wait_state(lease, state: LeaseState, timeout: float) -> None:
    wait_for(lambda: lease.state is state, timeout=timeout, what=f"lease state {state}")


def test_lockd_restart_before_the_deadline_renewals_resume(make_api, lockd_server, name):
    """Transient failure: unknown while lockd is down, renewed once it is back (same store)."""
    api = make_api(lockd_server.url)
    lost = []
    lease = api.acquire(name, 6.0, renew_every=0.5, on_lost=lost.append)
    _wait_state(lease, LeaseState.RENEWED, 3.0)
    lockd_server.stop()
    _wait_state(lease, LeaseState.UNKNOWN, 3.0)
    assert lease.last_error is not None
    down_deadline = lease.deadline
    lockd_server.start()
    assert time.monotonic() < down_deadline, "lockd took too long to restart for this test"
    _wait_state(lease, LeaseState.RENEWED, 3.0)
    assert lease.deadline > down_deadline and not lease.lost.is_set() and lost == []
    status = api.status(name)
    assert status.held and status.fence == lease.fence
    api.release(lease)
    assert lost == []


def test_lockd_back_after_the_deadline_lost_fires_once(make_api, lockd_server, name):
    api = make_api(lockd_server.url)
    lost = []
    ttl = 1.5
    lease = api.acquire(name, ttl, on_lost=lost.append)
    _wait_state(lease, LeaseState.RENEWED, 2.0)
    lockd_server.stop()
    _wait_state(lease, LeaseState.UNKNOWN, 2.0)
    deadline = lease.deadline
    assert api.wait_lost(lease, 3.0)
    lost_at = time.monotonic()
    assert deadline - 0.01 <= lost_at <= deadline + 0.5  # at the local deadline, not later
    assert lease.lost_reason.code == "local_deadline"
    lockd_server.start()
    time.sleep(ttl / 3)  # proves: lockd back does not revive the lease nor fire lost again
    assert lease.state is LeaseState.LOST and lost == [lease]
    with pytest.raises(LeaseLostError):
        api.release(lease)
    assert lost == [lease]
    again = api.acquire(name, 1.0, wait=3.0)
    assert again.fence > lease.fence
    api.release(again)


def test_hung_lockd_lease_lost_at_the_local_deadline(make_api, lockd_server, name):
    """lockd frozen (SIGSTOP): renew requests hang, yet lost fires on time (request timeouts
    are capped by the deadline) and a late answer never revives the lease."""
    api = make_api(lockd_server.url)
    ttl = 1.2
    lease = api.acquire(name, ttl)
    _wait_state(lease, LeaseState.RENEWED, 2.0)
    lockd_server.pause()
    try:
        deadline_then = lease.deadline
        assert api.wait_lost(lease, 3.0)
        lost_at = time.monotonic()
        assert lost_at <= lease.deadline + 0.5
        assert lease.deadline <= deadline_then + 0.45  # at most one renewal was in flight
    finally:
        lockd_server.resume()
    time.sleep(ttl / 4)  # proves: the late answers of the resumed lockd do not revive it
    assert lease.state is LeaseState.LOST
