"""redis-py's own lock tests (``tests/test_lock.py`` of redis/redis-py), ported where lockd's
``Lock`` has the same behaviour. Each test is named for the one it ports and runs with ``Lock``
and ``AsyncLock`` (``make_api``), against a real lockd.

Translations: redis-py's ``timeout`` is ``ttl``, its ``blocking_timeout`` the Lock's ``wait``;
"the key holds this lock's token" is "lockd shows the lock held at this lease's fence"; where
redis-py overwrites the key to take the lock away (``r.set("foo", "a")``), an operator ends the
lease by its id (``LeaseRef``); where it shortens the TTL behind the lock's back (``pexpire``),
the holder sets it (``extend(5, replace_ttl=True)``). redis-py's ``LockNotOwnedError`` is
``LeaseLostError``. The tests that have no equivalent, and every difference by design, are
listed with the reasons in ``docs/client-redis-compat.md``.
"""

from __future__ import annotations

import inspect
import time

import pytest

from lockd import AcquireTimeout, LeaseLostError, LeaseRef, LockClientError, LockError


@pytest.fixture
def api(make_api, shared_lockd):
    return make_api(shared_lockd.url)


@pytest.fixture
def other(make_api, shared_lockd):
    """Someone else: another client of the same lockd."""
    return make_api(shared_lockd.url)


def holds(api, name, lock) -> bool:
    """lockd shows ``name`` held by ``lock``'s lease (redis-py: ``r.get(name) == token``)."""
    status = api.status(name)
    return status.held and lock.fence is not None and status.fence == lock.fence


def owned_at_lockd(api, lock) -> bool:
    """``lock.owned(check=True)``; awaited on the facade's loop for an ``AsyncLock``."""
    answer = lock.owned(check=True)
    if inspect.isawaitable(answer):
        async def wait():
            return await answer

        return api.run(wait())
    return answer


def test_lock(api, name):
    lock = api.lock_object(name, 10)
    assert lock.acquire(blocking=False)
    assert holds(api, name, lock)
    lock.release()
    assert api.status(name).held is False


def test_lock_token(api, name):
    lock = api.lock_object(name, 10)
    assert lock.token is None
    assert lock.acquire(blocking=False)
    assert lock.token == lock.lease.token and lock.token.count(".") == 2  # issued by lockd (JWS)
    lock.release()
    assert api.status(name).held is False
    assert lock.token is None


def test_locked(api, name):
    lock = api.lock_object(name, 10)
    assert lock.locked() is False
    lock.acquire(blocking=False)
    assert lock.locked() is True
    lock.release()
    assert lock.locked() is False


def test_owned(api, name):
    lock = api.lock_object(name, 10)
    assert lock.owned() is False and owned_at_lockd(api, lock) is False
    lock.acquire(blocking=False)
    assert lock.owned() is True and owned_at_lockd(api, lock) is True
    lock.release()
    assert lock.owned() is False and owned_at_lockd(api, lock) is False

    lock2 = api.lock_object(name, 10)
    assert lock.owned() is False
    assert lock2.owned() is False
    lock2.acquire(blocking=False)
    assert lock.owned() is False and owned_at_lockd(api, lock) is False
    assert lock2.owned() is True and owned_at_lockd(api, lock2) is True
    lock2.release()
    assert lock.owned() is False
    assert lock2.owned() is False and owned_at_lockd(api, lock2) is False


def test_competing_locks(api, name):
    lock1 = api.lock_object(name, 10)
    lock2 = api.lock_object(name, 10)
    assert lock1.acquire(blocking=False)
    assert not lock2.acquire(blocking=False)
    lock1.release()
    assert lock2.acquire(blocking=False)
    assert not lock1.acquire(blocking=False)
    lock2.release()


def test_timeout(api, name):
    lock = api.lock_object(name, 10)
    assert lock.acquire(blocking=False)
    assert 8 < api.status(name).ttl <= 10
    lock.release()


def test_float_timeout(api, name):
    lock = api.lock_object(name, 9.5)
    assert lock.acquire(blocking=False)
    assert 8 < api.status(name).ttl <= 9.5
    lock.release()


def _fails_after_about(lock, bt: float) -> None:
    """``lock.acquire()`` gives up after about ``bt`` seconds: not before (redis-py allows
    ``bt - sleep``; lockd waits server-side, so no polling interval to subtract), and within a
    second more (redis-py's fudge is 50 ms; these run beside other suites on a shared machine)."""
    start = time.monotonic()
    assert not lock.acquire()
    assert bt + 1.0 > (time.monotonic() - start) > bt - 0.05


def test_blocking_timeout(api, name):
    lock1 = api.lock_object(name, 10)
    assert lock1.acquire(blocking=False)
    lock2 = api.lock_object(name, 10, wait=0.4)
    _fails_after_about(lock2, 0.4)
    lock1.release()


def test_context_manager(api, name):
    # the Lock's wait prevents a deadlock if the lock can't be acquired for some reason
    with api.lock_object(name, 10, wait=0.2) as lease:  # yields the Lease, not the Lock
        assert api.status(name).held and api.status(name).fence == lease.fence
    assert api.status(name).held is False


def test_context_manager_blocking_timeout(api, name):
    with api.lock_object(name, 10, wait=0):  # redis-py: blocking=False
        lock2 = api.lock_object(name, 10, wait=0.4)
        _fails_after_about(lock2, 0.4)


def test_context_manager_raises_when_locked_not_acquired(api, other, name):
    held = other.lock_object(name, 10)
    assert held.acquire()
    with pytest.raises(AcquireTimeout) as info:  # redis-py: LockError
        with api.lock_object(name, 10, wait=0.1):
            pass
    assert isinstance(info.value, LockClientError)
    held.release()


def test_releasing_unlocked_lock_raises_error(api, name):
    lock = api.lock_object(name, 10)
    with pytest.raises(LockError):
        lock.release()


def test_releasing_lock_no_longer_owned_raises_error(api, other, name):
    lock = api.lock_object(name, 10)
    lock.acquire(blocking=False)
    other.release(LeaseRef(name, lock.lease.lease_id))  # the lease taken away
    with pytest.raises(LeaseLostError):  # redis-py: LockNotOwnedError
        lock.release()
    # even though we errored, the token is still cleared
    assert lock.token is None


def test_extend_lock(api, name):
    lock = api.lock_object(name, 10)
    assert lock.acquire(blocking=False)
    assert 8 < api.status(name).ttl <= 10
    assert lock.extend(10)
    assert 16 < api.status(name).ttl <= 20
    lock.release()


def test_extend_lock_replace_ttl(api, name):
    lock = api.lock_object(name, 10)
    assert lock.acquire(blocking=False)
    assert 8 < api.status(name).ttl <= 10
    assert lock.extend(10, replace_ttl=True)
    assert 8 < api.status(name).ttl <= 10
    lock.release()


def test_extend_lock_float(api, name):
    lock = api.lock_object(name, 10.0)
    assert lock.acquire(blocking=False)
    assert 8 < api.status(name).ttl <= 10
    assert lock.extend(10.0)
    assert 16 < api.status(name).ttl <= 20
    lock.release()


def test_extending_unlocked_lock_raises_error(api, name):
    lock = api.lock_object(name, 10)
    with pytest.raises(LockError):
        lock.extend(10)


def test_extending_lock_no_longer_owned_raises_error(api, other, name):
    lock = api.lock_object(name, 10)
    assert lock.acquire(blocking=False)
    other.release(LeaseRef(name, lock.lease.lease_id))
    with pytest.raises(LeaseLostError):  # redis-py: LockNotOwnedError
        lock.extend(10)


def test_reacquire_lock(api, name):
    lock = api.lock_object(name, 10)
    assert lock.acquire(blocking=False)
    assert lock.extend(5, replace_ttl=True)  # redis-py: r.pexpire("foo", 5000)
    assert api.status(name).ttl <= 5
    assert lock.reacquire()
    assert 8 < api.status(name).ttl <= 10
    lock.release()


def test_reacquiring_unlocked_lock_raises_error(api, name):
    lock = api.lock_object(name, 10)
    with pytest.raises(LockError):
        lock.reacquire()


def test_reacquiring_lock_no_longer_owned_raises_error(api, other, name):
    lock = api.lock_object(name, 10)
    assert lock.acquire(blocking=False)
    other.release(LeaseRef(name, lock.lease.lease_id))
    with pytest.raises(LeaseLostError):  # redis-py: LockNotOwnedError
        lock.reacquire()


def test_context_manager_reacquiring_lock_no_longer_owned_raises_error(api, other, name):
    with pytest.raises(LeaseLostError):  # redis-py: LockNotOwnedError
        with api.lock_object(name, 10, wait=0) as lease:
            other.release(LeaseRef(name, lease.lease_id))


def test_lock_error_gives_correct_lock_name(api, other, name):
    held = other.lock_object(name, 10)
    assert held.acquire()
    with pytest.raises(AcquireTimeout) as info:
        with api.lock_object(name, 10, wait=0.1):
            pass
    assert info.value.lock == name  # redis-py: .lock_name
    held.release()
    with pytest.raises(LockError) as misuse:
        api.lock_object(name, 10).release()
    assert misuse.value.lock == name


def test_context_manager_releasing_inside_the_block_raises_lock_error_at_exit(api, name):
    """redis-py: ``with lock: lock.release()`` raises ``LockError`` when the block ends."""
    lock = api.lock_object(name, 10)
    with pytest.raises(LockError) as info:
        with lock:
            lock.release()
    assert info.value.lock == name and lock.lease is None
    with pytest.raises(LockError):  # the same when the lease itself was released in the block
        with lock as lease:
            api.release(lease)
    assert api.status(name).held is False
    with pytest.raises(RuntimeError, match="boom"):  # the block's own error goes on unchanged
        with lock:
            lock.release()
            raise RuntimeError("boom")
