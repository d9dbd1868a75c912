"""``fenced_transaction`` keeps lockd's keys by the proxy's rules (``lockd.common.keycache``): a
key lockd retired stops verifying once the cached set is older than the maximum age, and while
lockd cannot be reached the set it has is kept. lockd's ``GET /v1/keys`` is played by a real
HTTP server whose document the test swaps (``tests.proxy.test_jwks.JwksServer``).
"""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from harness import pg_available, wait_for
from lockd import InvalidToken, ServiceUnavailable
from lockd.client import sqlfence
from lockd.client.sqlfence import async_fenced_transaction, fenced_transaction
from lockd.tokens import KeyRing
from tests.client.test_sqlfence import dsn, fences  # noqa: F401
from tests.proxy.test_jwks import JwksServer

pytestmark = pytest.mark.skipif(pg_available() is not None, reason="PostgreSQL not reachable")


@pytest.fixture
def lockd_keys(monkeypatch):
    """A stand-in for lockd's JWKS, with the keys' maximum age cut to 0.3 s."""
    monkeypatch.setattr(sqlfence, "KEYS_MAX_AGE_S", 0.3)
    monkeypatch.setattr(sqlfence, "KEYS_MIN_INTERVAL_S", 0.1)
    server = JwksServer().start()
    yield server
    server.stop()
    sqlfence._keys.pop(server.url, None)
    sqlfence._akeys.pop(server.url, None)


def _refused(conn, token: str, url: str) -> bool:
    try:
        with fenced_transaction(conn, token, lockd_url=url):
            return False
    except InvalidToken:
        return True


def test_a_retired_keys_token_is_refused_after_the_maximum_age(dsn, lockd_keys):  # noqa: F811
    old, new = KeyRing.generate(), KeyRing.generate()
    lockd_keys.jwks = {"keys": old.jwks()["keys"] + new.jwks()["keys"]}
    token = old.sign("retire/a", 1)
    with psycopg.connect(dsn) as conn:
        with fenced_transaction(conn, token, lockd_url=lockd_keys.url) as claims:
            assert claims.locks == {"retire/a": 1}
        fetched = lockd_keys.fetches
        lockd_keys.jwks = new.jwks()  # lockd retired the old key
        wait_for(lambda: _refused(conn, token, lockd_keys.url), timeout=10,
                 what="the retired key's token refused")
        assert lockd_keys.fetches > fetched
        with fenced_transaction(conn, new.sign("retire/a", 2), lockd_url=lockd_keys.url):
            pass

    async def main():
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            async with async_fenced_transaction(aconn, token, lockd_url=lockd_keys.url):
                pass

    with pytest.raises(InvalidToken):
        asyncio.run(main())
    assert fences(dsn) == {"retire/a": 2}


def test_the_keys_are_kept_while_lockd_cannot_be_reached(dsn, lockd_keys):  # noqa: F811
    ring, other = KeyRing.generate(), KeyRing.generate()
    lockd_keys.jwks = ring.jwks()
    with psycopg.connect(dsn) as conn:
        with fenced_transaction(conn, ring.sign("kept/a", 1), lockd_url=lockd_keys.url):
            pass
        lockd_keys.stop()  # lockd is gone; the set is past its age soon
        keys = sqlfence._keys[lockd_keys.url]

        def refetch_failed() -> bool:
            with fenced_transaction(conn, ring.sign("kept/a", 2), lockd_url=lockd_keys.url):
                pass  # verified all along, with the set it has
            return keys.available is False

        wait_for(refetch_failed, timeout=10, what="a refetch that failed")
        with fenced_transaction(conn, ring.sign("kept/a", 3), lockd_url=lockd_keys.url):
            pass  # the key it has still verifies
        with pytest.raises(ServiceUnavailable) as caught:
            with fenced_transaction(conn, other.sign("kept/a", 4), lockd_url=lockd_keys.url):
                pass
        assert caught.value.code == "lockd_unreachable"
    assert fences(dsn) == {"kept/a": 3}
