"""What the reusable ``Lock`` / ``AsyncLock`` adds over the lease API (redis-py / kazoo style):
``locked()`` vs ``owned()`` (local, or ``check=True`` at lockd), reuse, ``blocking=False``,
``timeout``, ``extend`` (adds, or sets) and ``reacquire``, ``fence`` and ``token``, misuse
errors. Run with both clients (``make_api``); the behaviour both share with the lease API is
judged by ``test_behaviour`` (its ``sync-lock`` / ``async-lock`` runs), redis-py's own lock
tests by ``test_redis_compat``."""

from __future__ import annotations

import inspect
import time

import pytest

from harness import wait_for
from lockd import (
    LeaseLostError,
    LeaseRef,
    LeaseState,
    LockClientError,
    LockError,
    LockValueError,
    ValidationError,
)
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
    lease = mine.lease
    mine.release()
    assert not mine.owned() and mine.locked() is False
    assert lease.state is LeaseState.RELEASED
    assert mine.lease is None and mine.fence is None and mine.token is None


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
    holder_fence = holder.fence
    holder.release()
    assert lk.acquire(timeout=2.0) is True and lk.fence > holder_fence
    lk.release()


def test_the_lock_wait_is_the_default_timeout(api, other, name):
    holder = other.lock_object(name, 5.0)
    assert holder.acquire()
    lk = api.lock_object(name, 1.0, wait=0.3)
    t0 = time.monotonic()
    assert lk.acquire() is False
    assert 0.25 <= time.monotonic() - t0 < 3.0
    holder.release()


def test_misuse_is_a_lock_error_still_a_runtime_error(api, name):
    lk = api.lock_object(name, 2.0)
    for call in (lk.release, lambda: lk.extend(3.0), lk.reacquire):
        with pytest.raises(LockError, match="does not hold") as info:
            call()
        assert isinstance(info.value, LockClientError) and isinstance(info.value, RuntimeError)
        assert info.value.lock == name and info.value.code == "lock_misuse"
    assert lk.acquire()
    with pytest.raises(LockError, match="already holds"):
        lk.acquire(blocking=False)  # not re-entrant, like threading.Lock
    with pytest.raises(LockError, match="already holds"):
        lk.__enter__()
    lk.release()
    with pytest.raises(RuntimeError, match="does not hold"):
        lk.release()
    assert not api.requests[("POST", f"/v1/locks/{name}/renew")]  # misuse sends nothing


@pytest.mark.parametrize(("make", "use"), [
    (lambda api, n: api.lock_object(n, 0.0), None),
    (lambda api, n: api.lock_object(n, -1.0), None),
    (lambda api, n: api.lock_object(n, float("nan")), None),
    (lambda api, n: api.lock_object(n, 2.0, wait=-1), None),
    (lambda api, n: api.lock_object(n, 2.0, renew_every=2.0), None),
    (lambda api, n: api.lock_object(n, 2.0), lambda lk: lk.acquire(blocking=False, timeout=1.0)),
    (lambda api, n: api.lock_object(n, 2.0), lambda lk: lk.acquire(timeout=-0.5)),
])
def test_bad_arguments_are_a_lock_value_error_still_a_value_error(api, name, make, use):
    with pytest.raises(LockValueError) as info:
        lk = make(api, name)
        use(lk)
    assert isinstance(info.value, LockClientError) and isinstance(info.value, ValueError)
    assert info.value.lock == name and not api.requests  # refused before any request


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), "5", None, True])
def test_extend_refuses_a_bad_additional_time(api, name, bad):
    lk = api.lock_object(name, 2.0, auto_renew=False)
    assert lk.acquire()
    with pytest.raises(LockValueError, match="additional_time"):
        lk.extend(bad)
    with pytest.raises(LockValueError, match="additional_time"):
        lk.extend(bad, replace_ttl=True)
    assert not api.requests[("POST", f"/v1/locks/{name}/renew")]
    lk.release()


def test_extend_adds_to_what_is_left_same_fence(api, name):
    ttl = 1.0
    lk = api.lock_object(name, ttl, auto_renew=False)
    assert lk.acquire()
    fence, before = lk.fence, lk.lease.deadline
    time.sleep(ttl * 0.3)  # proves: extend adds to what is left (0.3 TTL used), not to the TTL
    assert lk.extend(4.0) is True
    # the local deadline moved by the added time (the client's own view of what was left)
    assert before + 4.0 <= lk.lease.deadline < before + 4.0 + 0.3
    assert lk.fence == fence and lk.ttl == 1.0 and 4.0 < lk.lease.ttl < 4.75
    assert 4.0 < api.status(name).ttl <= 4.75
    lk.release()


def test_extend_with_replace_ttl_sets_it_from_now(api, name):
    lk = api.lock_object(name, 5.0, auto_renew=False)
    assert lk.acquire()
    fence = lk.fence
    assert lk.extend(1.5, replace_ttl=True) is True
    assert lk.fence == fence and lk.ttl == 5.0 and lk.lease.ttl == 1.5
    assert 1.0 < api.status(name).ttl <= 1.5
    lk.release()


def test_later_renewals_keep_the_extended_ttl_and_reacquire_goes_back(api, name):
    lk = api.lock_object(name, 1.0, renew_every=0.1)
    assert lk.acquire()
    assert lk.extend(2.0)
    renewals = api.renew_count(name)
    # background renewals, each for the lease's (extended) TTL
    wait_for(lambda: api.renew_count(name) > renewals + 1, timeout=5, what="background renewals")
    assert lk.lease.ttl > 2.0
    assert api.status(name).ttl > 2.0
    assert lk.reacquire() is True
    assert lk.lease.ttl == 1.0
    # lockd may have served a background renewal sent just before the reacquire after it (two
    # connections): the next renewal, for the lease's 1 s, brings it back
    wait_for(lambda: api.status(name).ttl <= 1.0, timeout=5, what="lockd back at 1 s")
    renewals = api.renew_count(name)
    wait_for(lambda: api.renew_count(name) > renewals + 1, timeout=5,
             what="renewals after the reacquire")
    assert lk.lease.ttl == 1.0 and lk.owned()
    lk.release()


def test_extend_beyond_lockds_max_ttl_says_so_and_keeps_the_lease(api, name):
    lk = api.lock_object(name, 3000.0, auto_renew=False)  # lockd's max is 3600 s
    assert lk.acquire()
    fence = lk.fence
    with pytest.raises(ValidationError) as info:
        lk.extend(1000)
    message = str(info.value)
    assert "3600000" in message and "+ 1000 s" in message and "replace_ttl=True" in message
    assert info.value.status == 422
    with pytest.raises(ValidationError, match="a TTL of 4000 s"):
        lk.extend(4000, replace_ttl=True)
    assert owned_at_lockd(api, lk) and lk.fence == fence  # unchanged, still held
    assert 2990 < api.status(name).ttl <= 3000
    lk.release()


def test_owned_is_local_and_check_asks_lockd(api, other, name):
    lk = api.lock_object(name, 2.0, auto_renew=False, owner="me")
    assert owned_at_lockd(api, lk) is False and not api.requests  # nothing held: no request
    assert lk.acquire()
    gets = api.requests[("GET", f"/v1/locks/{name}")]
    assert lk.owned() is True and api.requests[("GET", f"/v1/locks/{name}")] == gets
    assert owned_at_lockd(api, lk) is True
    assert api.requests[("GET", f"/v1/locks/{name}")] == gets + 1
    other.release(LeaseRef(name, lk.lease.lease_id))  # an operator ended it
    assert lk.owned() is True  # the local view has not heard of it yet
    assert owned_at_lockd(api, lk) is False  # lockd has
    theirs = other.lock_object(name, 2.0, owner="me")  # the same owner label, a new lease
    assert theirs.acquire(blocking=False)
    assert owned_at_lockd(api, lk) is False and owned_at_lockd(other, theirs) is True
    theirs.release()


def test_owned_check_is_a_bool_of_lock_and_awaited_of_async_lock(api, name):
    lk = api.lock_object(name, 2.0)
    assert lk.acquire()
    answer = lk.owned(check=True)
    if api.kind == "sync":
        assert answer is True
    else:
        with pytest.raises(LockError, match="await lock.owned"):
            bool(answer)  # an unawaited coroutine would have been silently true
        assert owned_at_lockd(api, lk) is True
    lk.release()


def owned_at_lockd(api, lk) -> bool:
    """``lk.owned(check=True)``, awaited on the facade's loop for an ``AsyncLock``."""
    answer = lk.owned(check=True)
    if inspect.isawaitable(answer):
        async def wait():
            return await answer

        return api.run(wait())
    return answer


def test_a_lost_lease_is_not_owned_and_release_says_lost(api, other, name):
    lk = api.lock_object(name, 1.0, auto_renew=False)
    assert lk.acquire()
    other.release(LeaseRef(name, lk.lease.lease_id))  # an operator ended it
    with pytest.raises(LeaseLostError):
        lk.extend(1.0)
    assert not lk.owned() and lk.lease.state is LeaseState.LOST
    assert lk.fence is not None  # a lost lease keeps its fence until released
    with pytest.raises(LeaseLostError):
        lk.reacquire()
    with pytest.raises(LeaseLostError):
        lk.release()
    assert lk.lease is None and lk.fence is None and lk.token is None
    with pytest.raises(LockError, match="does not hold"):
        lk.release()
    assert lk.acquire(blocking=False)  # a lost lease does not block the next acquire
    lk.release()


def test_the_with_block_clears_token_and_fence_at_exit(api, name):
    lk = api.lock_object(name, 2.0)
    with lk as lease:
        assert lk.token == lease.token and lk.fence == lease.fence
    assert lk.lease is None and lk.token is None and lk.fence is None
    assert lease.state is LeaseState.RELEASED
