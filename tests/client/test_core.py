"""The clients' I/O-free rules (``lockd.client.core``), stepped by hand on an injected clock.

No server and no sleeping: each test plays lockd's answers into a rule and reads the steps it
asks for next (``Send`` a request, ``Sleep`` so long). Both clients run these same rules, so
the timing asserted here is the timing of ``LockClient`` and ``AsyncLockClient``; the suites
against a real lockd (``test_behaviour`` and the rest) show the I/O around them.
"""

from __future__ import annotations

import pytest

from lockd import AcquireTimeout, LeaseState, ServiceUnavailable
from lockd.client.core import ClientCore, Send, Sleep, StepRun
from lockd.client.errors import LeaseLostError, LockNotAcquired
from lockd.client.lease import Lease


class Clock:
    """A monotonic clock that moves only when told (seconds)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _core(clock: Clock, timeout: float = 10.0) -> ClientCore:
    return ClientCore("http://127.0.0.1:9/", timeout, "me", clock)


def _body(lock: str = "a", ttl_ms: int = 9000) -> dict:
    return {"lock": lock, "lease_id": "l" * 32, "fence": 4, "token": "t.t.t", "ttl_ms": ttl_ms,
            "owner": "me"}


def _held() -> LockNotAcquired:
    return LockNotAcquired("held", status=409, code="held", owner="other", ttl_ms=3000)


def test_acquire_retries_an_early_refusal_after_50_ms_with_the_same_client_id():
    clock = Clock()
    steps = _core(clock)._acquire_steps("a", 9.0, 1.0, None, None, None, raise_timeout=True)
    first = next(steps)
    assert isinstance(first, Send) and first.path == "/v1/locks/a/acquire"
    assert first.json["wait_ms"] == 1000 and first.json["ttl_ms"] == 9000
    assert first.json["owner"] == "me" and first.timeout == 11.0
    assert isinstance(steps.throw(_held()), Sleep)  # answered at once: do not spin
    clock.now += 0.05
    second = steps.send(None)
    assert isinstance(second, Send) and second.json["client_id"] == first.json["client_id"]
    assert second.json["wait_ms"] == 950
    clock.now += 0.95
    with pytest.raises(AcquireTimeout) as info:
        steps.throw(_held())
    assert info.value.owner == "other" and info.value.waited == pytest.approx(1.0)


def test_acquire_backs_off_during_an_outage_and_raises_it_when_the_wait_is_over():
    clock = Clock()
    steps = _core(clock)._acquire_steps("a", 9.0, 1.0, None, None, None, raise_timeout=False)
    next(steps)
    pauses = []
    while clock.now < 100.9:
        pause = steps.throw(ServiceUnavailable("down", status=503))
        assert isinstance(pause, Sleep)
        pauses.append(pause.seconds)
        clock.now += pause.seconds
        assert isinstance(steps.send(None), Send)
    assert pauses[:4] == pytest.approx([0.05, 0.1, 0.2, 0.4])
    clock.now = 101.0
    with pytest.raises(ServiceUnavailable):
        steps.throw(ServiceUnavailable("down", status=503))


def test_a_grant_late_in_a_long_wait_is_renewed_before_the_lease_starts():
    clock = Clock()
    steps = _core(clock)._acquire_steps("a", 9.0, None, None, None, None, raise_timeout=True)
    assert next(steps).json["wait_ms"] == 300_000  # forever: in requests of lockd's cap
    clock.now += 4.0  # granted after more than ttl/3 of waiting
    renew = steps.send(_body())
    assert isinstance(renew, Send) and renew.path == "/v1/locks/a/renew"
    assert renew.json == {"lease_id": "l" * 32, "ttl_ms": 9000}
    sent = clock.now
    clock.now += 0.01
    with pytest.raises(StopIteration) as done:
        steps.send(_body())
    assert done.value.value == (sent, _body())  # the deadline counts from the renewal


def test_a_tried_acquire_of_a_held_lock_returns_none():
    run = StepRun(_core(Clock())._acquire_steps("a", 9.0, 0.0, None, None, None,
                                                raise_timeout=False))
    for step in run:
        assert isinstance(step, Send) and step.json["wait_ms"] == 0
        run.fail(_held())
    assert run.result is None


def test_renewal_runs_every_third_of_the_ttl_from_when_each_request_was_sent():
    clock = Clock()
    core = _core(clock)
    lease = Lease(core, _body(ttl_ms=9000), sent_at=clock.now)
    steps = core._renewal_steps(lease, clock.now, lambda: False)
    assert next(steps) == Sleep(pytest.approx(3.0))
    clock.now += 3.0
    renew = steps.send(None)
    assert isinstance(renew, Send) and renew.path == "/v1/locks/a/renew"
    assert renew.timeout == pytest.approx(6.0)  # capped by the time left before the deadline
    sent = clock.now
    clock.now += 0.5  # the answer took half a second
    assert steps.send(_body()) == Sleep(pytest.approx(2.5))
    assert lease.state is LeaseState.RENEWED and lease.deadline == pytest.approx(sent + 9.0)


def test_renewal_retries_a_transient_failure_until_the_local_deadline_declares_the_loss():
    clock = Clock()
    core = _core(clock)
    lease = Lease(core, _body(ttl_ms=3000), sent_at=clock.now)
    steps = core._renewal_steps(lease, clock.now, lambda: False)
    clock.now += next(steps).seconds
    step = steps.send(None)
    tries = 0
    while True:
        assert isinstance(step, Send)
        tries += 1
        pause = steps.throw(ServiceUnavailable("down", status=503))
        assert lease.state is LeaseState.UNKNOWN and isinstance(pause, Sleep)
        assert 0 < pause.seconds <= 0.25 + 1e-9  # a quarter interval, not past the deadline
        clock.now += pause.seconds
        try:
            step = steps.send(None)
        except StopIteration:
            break
    assert tries == 8  # from t+1 s to the deadline at t+3 s, every 0.25 s
    assert clock.now >= 103.0 and lease.state is LeaseState.LOST and lease.lost.is_set()
    assert lease.lost_reason is not None and lease.lost_reason.code == "local_deadline"


def test_renewal_stops_at_410_and_when_told_to():
    clock = Clock()
    core = _core(clock)
    lease = Lease(core, _body(), sent_at=clock.now)
    steps = core._renewal_steps(lease, clock.now, lambda: False)
    clock.now += next(steps).seconds
    steps.send(None)
    with pytest.raises(StopIteration):
        steps.throw(LeaseLostError("gone", status=410, code="lease_lost"))
    assert lease.state is LeaseState.LOST
    stopped = Lease(core, _body(), sent_at=clock.now)
    with pytest.raises(StopIteration):
        next(core._renewal_steps(stopped, clock.now, lambda: True))
    assert stopped.state is LeaseState.HELD


def test_a_background_renewal_answered_after_an_explicit_renew_does_not_undo_its_ttl():
    # extend(2.0) made the TTL 3 s; a background renewal for 3 s is in flight when reacquire()
    # renews for 1 s, and the background's answer comes back last
    clock = Clock()
    core = _core(clock)
    lease = Lease(core, _body(ttl_ms=3000), sent_at=clock.now)
    background = core._renewal_steps(lease, clock.now, lambda: False)
    next(background)
    clock.now += 1.0
    assert background.send(None).json["ttl_ms"] == 3000
    clock.now += 0.1
    explicit = core._renew_steps(lease, 1.0)
    assert next(explicit).json["ttl_ms"] == 1000
    with pytest.raises(StopIteration):
        explicit.send(_body(ttl_ms=1000))
    background_sent = clock.now - 0.1
    clock.now += 0.1
    background.send(_body(ttl_ms=3000))
    assert lease.ttl == 1.0  # the later request's TTL: the next renewals go back to 1 s
    assert lease.deadline == pytest.approx(background_sent + 3.0)  # the later expiry counts
    clock.now += 1.0
    assert background.send(None).json["ttl_ms"] == 1000


def test_a_background_renewal_sent_while_an_explicit_renew_is_in_flight_asks_its_ttl():
    # renew(ttl=5) is in flight when the background renewal of the 0.6 s lease falls due: the
    # background asks 5 s too, so whichever lockd serves last leaves the lease at 5 s
    clock = Clock()
    core = _core(clock)
    lease = Lease(core, _body(ttl_ms=600), sent_at=clock.now)
    background = core._renewal_steps(lease, clock.now, lambda: False)
    next(background)
    clock.now += 0.15
    explicit = core._renew_steps(lease, 5.0)
    assert next(explicit).json["ttl_ms"] == 5000
    clock.now += 0.1
    crossing = background.send(None)
    assert crossing.json["ttl_ms"] == 5000
    assert crossing.batch is not None and crossing.batch[2]() == 5000
    background.send(_body(ttl_ms=5000))  # the background's answer comes back first
    with pytest.raises(StopIteration):
        explicit.send(_body(ttl_ms=5000))
    assert lease.ttl == 5.0


def test_a_failed_explicit_renew_leaves_the_background_asking_the_lease_ttl():
    clock = Clock()
    core = _core(clock)
    lease = Lease(core, _body(ttl_ms=600), sent_at=clock.now)
    explicit = core._renew_steps(lease, 5.0)
    next(explicit)
    with pytest.raises(ServiceUnavailable):
        explicit.throw(ServiceUnavailable("down", status=503))
    background = core._renewal_steps(lease, clock.now, lambda: False)
    next(background)
    clock.now += 0.25
    assert background.send(None).json["ttl_ms"] == 600
