"""``FenceGuard.check``: the signature, the lock, the mode; keys fixed or from a real lockd
(the proxy's key cache: refetched on an unknown kid, kept while lockd is down)."""

from __future__ import annotations

import base64
import json

import pytest

from lockd import LockClient
from lockd.common.fencerule import READ, WRITE
from lockd.guard import (
    FenceGuard,
    InvalidToken,
    KeysUnavailable,
    LockNotAllowed,
    SharedToken,
    TokenRequired,
)
from lockd.tokens import KeyRing


def test_a_genuine_exclusive_token_for_the_lock_passes(guard, ring, lock):
    fence = guard.check(ring.sign(lock, 7), lock)
    assert (fence.lock, fence.fence, fence.purpose) == (lock, 7, WRITE)


def test_a_multi_lock_token_passes_for_each_of_its_locks(guard, ring, lock):
    token = ring.sign_many({lock: 3, lock + "x": 9})
    assert guard.check(token, lock + "x").fence == 9 and guard.check(token, lock).fence == 3


def test_no_token_is_428(guard, lock):
    for token in (None, ""):
        with pytest.raises(TokenRequired) as caught:
            guard.check(token, lock)
        assert caught.value.status == 428 and caught.value.problem()["code"] == "token_required"


def test_a_token_for_another_lock_is_403(guard, ring, lock):
    with pytest.raises(LockNotAllowed) as caught:
        guard.check(ring.sign(lock + "-other", 99), lock)
    problem = caught.value.problem()
    assert (problem["status"], problem["code"], problem["lock"]) == (403, "lock_not_allowed", lock)


def test_a_shared_token_never_writes_but_may_read(guard, ring, lock):
    token = ring.sign(lock, 4, extra={"mode": "shared"})
    with pytest.raises(SharedToken) as caught:
        guard.check(token, lock)
    assert caught.value.status == 403 and caught.value.problem()["code"] == "shared_token"
    assert guard.check(token, lock, purpose=READ).purpose is READ


def test_forged_and_tampered_tokens_are_401(guard, ring, lock):
    forged = KeyRing.generate().sign(lock, 10**12)
    header, payload, signature = ring.sign(lock, 1).split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    claims["fence"] = 10**12
    raised = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    for token in (forged, f"{header}.{raised}.{signature}", "not-a-token"):
        with pytest.raises(InvalidToken) as caught:
            guard.check(token, lock)
        assert caught.value.problem()["code"] == "invalid_token"


def test_exactly_one_key_source():
    with pytest.raises(TypeError):
        FenceGuard()
    with pytest.raises(TypeError):
        FenceGuard("http://127.0.0.1:1", jwks={"keys": []})


def test_keys_from_a_real_lockd_kept_while_it_is_down(lockd_server, lock):
    guard = FenceGuard(lockd_server.url, min_interval_s=0.0)
    with LockClient(lockd_server.url) as client:
        lease = client.acquire(lock, 30, auto_renew=False)
        assert guard.check(lease.token, lock).fence == lease.fence
        assert guard.keys.loads == 1
        lockd_server.stop()
        # verified again from the cached keys; an unknown key is "maybe genuine": 503
        assert guard.check(lease.token, lock).fence == lease.fence
        with pytest.raises(KeysUnavailable) as caught:
            guard.check(KeyRing.generate().sign(lock, 5), lock)
        assert caught.value.status == 503
