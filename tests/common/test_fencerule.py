"""The one rule for which token may write a lock (``lockd.common.fencerule``), on real signed
tokens: a lock held exclusively is fenced for writing or reading, a lock held shared only for
reading (``SharedHold`` for a write), in lock-name order for a whole token; a fence passes iff
the upsert returned it."""

from __future__ import annotations

import pytest

from lockd.common.fencerule import READ, WRITE, Fence, SharedHold, fence_for, fences_of, stale
from lockd.tokens import KeyRing, Verifier

RING = KeyRing.generate()


def claims(token: str):
    return Verifier(RING.jwks()).verify(token)


def test_an_exclusive_hold_is_fenced_for_writing_or_reading():
    c = claims(RING.sign("acct/1", 7))
    assert fence_for(c, "acct/1", WRITE) == Fence("acct/1", 7, False, False, WRITE)
    assert fence_for(c, "acct/1", READ) == Fence("acct/1", 7, False, False, READ)
    assert fence_for(c, "acct/1", None).writes  # what the hold allows: writing
    assert fence_for(c, "acct/10", WRITE) is None  # a lock whose name contains it: not held


def test_a_shared_hold_is_fenced_for_reading_only():
    c = claims(RING.sign("acct/1", 7, extra={"mode": "shared"}))
    with pytest.raises(SharedHold) as caught:
        fence_for(c, "acct/1", WRITE)
    assert caught.value.lock == "acct/1" and "never writes" in str(caught.value)
    for purpose in (READ, None):
        fence = fence_for(c, "acct/1", purpose)
        assert fence == Fence("acct/1", 7, False, True, READ) and not fence.writes


def test_a_whole_token_in_lock_name_order():
    c = claims(RING.sign_many({"acct/10": 3, "acct/1": 2, "acct/1/x": 4},
                              extra={"shared": ["acct/10", "acct/1/x"]}))
    fences = fences_of(c, None)
    assert [(f.lock, f.fence, f.purpose, f.multi) for f in fences] == [
        ("acct/1", 2, WRITE, True), ("acct/1/x", 4, READ, True), ("acct/10", 3, READ, True)]
    assert [f.purpose for f in fences_of(c, READ)] == [READ, READ, READ]
    with pytest.raises(SharedHold) as caught:
        fences_of(c, WRITE)
    assert caught.value.lock == "acct/1/x"  # the first shared lock in lock-name order


def test_a_fence_passes_iff_the_upsert_returned_it():
    a, b = Fence("a", 5), Fence("b", 5, shared=True, purpose=READ)
    assert stale([a, b], [5, 5]) == []
    assert stale([a, b], [6, 5]) == [(a, 6)]
    assert stale([a, b], [5, 9]) == [(b, 9)]
