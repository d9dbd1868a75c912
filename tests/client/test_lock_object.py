"""What the reusable ``Lock`` / ``AsyncLock`` adds over the lease API (redis-py / kazoo style):
``locked()`` vs ``owned()``, reuse, ``blocking=False``, ``timeout``, ``extend``, ``fence`` and
``token``, misuse errors. Run with both clients (``make_api``); the behaviour both share with
the lease API is judged by ``test_behaviour`` (its ``sync-lock`` / ``async-lock`` runs)."""

from __future__ import annotations

import time

import pytest

from lockd import LeaseLostError, LeaseRef, LeaseState
from lockd.client import AsyncLock, Lock


@pytest.fixture
def api(make_api, shared_lockd):
    return make_api(shared_lockd.url)


@pytest.fixture
def other(make_api, shared_lockd):
    return make_api(shared_lockd.url)


def test_client_lock_returns_a_lock_object_without_a_request(api, name):
    lk = api.lock_object(name, 2.0)
    target = getattr(lk, "_target", lk)
    assert isinstance(target, AsyncLock if api.kind == "async" else Lock)
    assert lk.fence is None and lk.token is None and lk.lease is None and not lk.owned()
    assert not api.requests  # nothing sent until acquire


def test_locked_is_anyones_owned_is_this_objects(api, other, name):
    mine, theirs = api.lock_object(name, 2.0), other.lock_object(name, 2.0)
    assert mine.locked() is False and theirs.locked() is False
    assert mine.acquire(blocking=False) is True
    assert mine.locked() and mine.owned()
    assert theirs.locked() and not theirs.owned()
    assert theirs.acquire(blocking=False) is False and theirs.lease is None
    assert mine.fence == other.status(name).fence and mine.token.count(".") == 2
    mine.release()
    assert not mine.owned() and mine.locked() is False
    assert mine.lease.state is LeaseState.RELEASED and mine.fence is not None  # the last lease


def test_one_object_is_reusable_each_acquire_a_new_lease(api, name):
    lk = api.lock_object(name, 2.0)
    fences = []
    for _ in range(3):
        assert lk.acquire(blocking=False)
        fences.append(lk.fence)
        lk.release()
    assert fences == sorted(fences) and len(set(fences)) == 3
    with lk as lease:  # and as a context manager, after explicit use
        assert lease is lk.lease and lk.owned() and lease.fence > fences[-1]
    assert not lk.owned()


def test_acquire_with_a_timeout_returns_false_after_it(api, other, name):
    holder = other.lock_object(name, 5.0, owner="holder")
    assert holder.acquire()
    lk = api.lock_object(name, 1.0)
    t0 = time.monotonic()
    assert lk.acquire(timeout=0.4) is False
    assert 0.35 <= time.monotonic() - t0 < 3.0
    holder.release()
    assert lk.acquire(timeout=2.0) is True and lk.fence > holder.fence
    lk.release()


def test_the_lock_wait_is_the_default_timeout(api, other, name):
    holder = other.lock_object(name, 5.0)
    assert holder.acquire()
    lk = api.lock_object(name, 1.0, wait=0.3)
    t0 = time.monotonic()
    assert lk.acquire() is False
    assert 0.25 <= time.monotonic() - t0 < 3.0
    holder.release()


def test_misuse_is_a_runtime_error(api, name):
    lk = api.lock_object(name, 2.0)
    with pytest.raises(RuntimeError, match="does not hold"):
        lk.release()
    with pytest.raises(RuntimeError, match="does not hold"):
        lk.extend(3.0)
    assert lk.acquire()
    with pytest.raises(RuntimeError, match="already holds"):
        lk.acquire(blocking=False)  # not re-entrant, like threading.Lock
    with pytest.raises(ValueError):
        lk.acquire(blocking=False, timeout=1.0)
    lk.release()
    with pytest.raises(RuntimeError, match="does not hold"):
        lk.release()


def test_extend_renews_for_the_new_ttl_same_fence(api, name):
    lk = api.lock_object(name, 1.0, auto_renew=False)
    assert lk.acquire()
    fence, before = lk.fence, lk.lease.deadline
    lk.extend(4.0)
    assert lk.fence == fence and lk.ttl == 4.0 and lk.lease.ttl == 4.0
    assert lk.lease.deadline > before + 2.5 and api.status(name).ttl > 3.0
    lk.release()


def test_a_lost_lease_is_not_owned_and_release_says_lost(api, other, name):
    lk = api.lock_object(name, 1.0, auto_renew=False)
    assert lk.acquire()
    other.release(LeaseRef(name, lk.lease.lease_id))  # an operator ended it
    with pytest.raises(LeaseLostError):
        lk.extend()
    assert not lk.owned() and lk.lease.state is LeaseState.LOST
    with pytest.raises(LeaseLostError):
        lk.release()
    assert lk.acquire(blocking=False)  # a lost lease does not block the next acquire
    lk.release()
