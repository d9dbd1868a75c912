"""The key set rules every verifier of lockd's tokens keeps (``lockd.common.keycache``), for the
blocking and the asyncio flavour alike, with an injected clock: fetched on first use and cached,
refetched on an unknown ``kid`` at most once per ``min_interval_s`` and once older than
``max_age_s`` (a retired key's cached tokens stop verifying), kept while the source fails, with
the retries in the background (no caller waits for a source that does not answer)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from harness import wait_for
from lockd.common.keycache import AsyncKeyCache, KeyCache, KeysUnavailable
from lockd.tokens import InvalidToken, KeyRing, UnknownKey


class Source:
    """What the cache fetches: ``jwks`` (a dict), or ``down`` (raises); counts the fetches.
    ``gate``: when set, a fetch waits for it (a source that does not answer)."""

    def __init__(self, jwks: dict):
        self.jwks = jwks
        self.down = False
        self.fetches = 0
        self.gate: threading.Event | None = None

    def load(self) -> dict:
        self.fetches += 1
        if self.gate is not None:
            self.gate.wait(10)
        if self.down:
            raise OSError("connection refused")
        return self.jwks


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Flavour:
    """One API over both caches: ``verify(token)`` blocks either way."""

    def __init__(self, kind: str, source: Source, clock: Clock, **rules):
        self.kind = kind
        rules = {"min_interval_s": 1.0, "max_age_s": 60.0, "clock": clock, **rules}
        if kind == "sync":
            self.cache = KeyCache(source.load, **rules)
            return
        self.loop = asyncio.new_event_loop()

        async def load() -> dict:
            return await asyncio.to_thread(source.load)

        self.cache = AsyncKeyCache(load, **rules)

    def verify(self, token: str):
        if self.kind == "sync":
            return self.cache.verify(token)
        return self.loop.run_until_complete(self.cache.verify(token))

    def settle(self) -> None:
        """Let background work run (the async flavour's tasks run while its loop does)."""
        if self.kind == "async":
            # pump: runs the loop 50 ms so its tasks progress; callers poll with wait_for
            self.loop.run_until_complete(asyncio.sleep(0.05))

    def close(self) -> None:
        if self.kind == "async":
            self.loop.close()


@pytest.fixture(params=["sync", "async"])
def make(request):
    made: list[Flavour] = []

    def build(source: Source, clock: Clock, **rules) -> Flavour:
        made.append(Flavour(request.param, source, clock, **rules))
        return made[-1]

    yield build
    for flavour in made:
        flavour.close()


def test_fetched_once_then_refetched_on_an_unknown_kid_at_most_once_a_second(make):
    old, new, stranger = KeyRing.generate(), KeyRing.generate(), KeyRing.generate()
    source, clock = Source(old.jwks()), Clock()
    keys = make(source, clock)
    assert keys.verify(old.sign("a", 1)).fence == 1
    assert keys.verify(old.sign("a", 2)).fence == 2 and source.fetches == 1
    source.jwks = {"keys": old.jwks()["keys"] + new.jwks()["keys"]}  # lockd rotated
    clock.now += 1
    assert keys.verify(new.sign("a", 3)).fence == 3 and source.fetches == 2
    for _ in range(5):  # invented kids: one refetch per second at most
        with pytest.raises(UnknownKey):
            keys.verify(stranger.sign("a", 4))
    assert source.fetches == 2
    clock.now += 1
    with pytest.raises(UnknownKey):
        keys.verify(stranger.sign("a", 4))
    assert source.fetches == 3
    with pytest.raises(InvalidToken):
        keys.verify("not.a.token")


def test_a_retired_keys_cached_token_stops_verifying_after_the_maximum_age(make):
    old, new = KeyRing.generate(), KeyRing.generate()
    source, clock = Source({"keys": old.jwks()["keys"] + new.jwks()["keys"]}), Clock()
    keys = make(source, clock, max_age_s=30.0)
    token = old.sign("a", 1)
    assert keys.verify(token).fence == 1
    source.jwks = new.jwks()  # lockd retired the old key
    clock.now += 29
    assert keys.verify(token).fence == 1, "within the maximum age: the cached set"
    clock.now += 1
    with pytest.raises(UnknownKey):
        keys.verify(token)
    assert keys.cache.peek(token) is None and keys.cache.kids == frozenset(new.kids)


def test_a_failing_source_keeps_the_set_and_is_retried_in_the_background(make):
    ring, other = KeyRing.generate(), KeyRing.generate()
    source, clock = Source(ring.jwks()), Clock()
    keys = make(source, clock, max_age_s=30.0)
    assert keys.verify(ring.sign("a", 1)).fence == 1
    source.down = True
    clock.now += 30
    assert keys.verify(ring.sign("a", 2)).fence == 2, "the set it has still verifies"
    assert keys.cache.available is False and "connection refused" in keys.cache.last_error
    with pytest.raises(KeysUnavailable) as caught:
        keys.verify(other.sign("a", 3))
    assert caught.value.reason == "connection refused"
    # due again: the retry runs in the background, the caller does not wait for it
    source.gate, fetches = threading.Event(), source.fetches
    clock.now += 1
    assert keys.verify(ring.sign("a", 4)).fence == 4
    wait_for(lambda: (keys.settle(), source.fetches == fetches + 1)[1],
             what="a background refetch")
    source.down = False
    source.jwks = {"keys": ring.jwks()["keys"] + other.jwks()["keys"]}
    source.gate.set()
    wait_for(lambda: (keys.settle(), keys.cache.available)[1], what="the source answering")
    assert keys.verify(other.sign("a", 5)).fence == 5


def test_the_first_fetch_failing_is_keys_unavailable_not_an_unknown_key(make):
    ring = KeyRing.generate()
    source = Source(ring.jwks())
    source.down = True
    keys = make(source, Clock())
    with pytest.raises(KeysUnavailable, match="could not be fetched"):
        keys.verify(ring.sign("a", 1))
