"""Fixtures of the guard suite: a key ring that signs tokens (the guard's fixed-key mode), the
machine's real Redis 7 with the guard's function library loaded, and per-test key prefixes."""

from __future__ import annotations

import uuid

import pytest

from lockd.guard import FenceGuard
from lockd.tokens import KeyRing
from tests.conftest import require

REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture(scope="session")
def ring() -> KeyRing:
    return KeyRing.generate()


@pytest.fixture
def guard(ring: KeyRing) -> FenceGuard:
    return FenceGuard(jwks=ring.jwks())


@pytest.fixture
def lock() -> str:
    return f"guard-{uuid.uuid4().hex[:10]}/1"


def redis_reason() -> str | None:
    try:
        import redis
    except ImportError as exc:
        return f"the redis package is missing ({exc})"
    try:
        with redis.Redis.from_url(REDIS_URL, socket_timeout=2) as client:
            version = client.info()["redis_version"]
    except redis.RedisError as exc:
        return f"Redis at {REDIS_URL} does not answer ({exc})"
    if int(version.split(".")[0]) < 7:
        return f"Redis {version} has no functions (7 or later needed)"
    return None


@pytest.fixture
def redis_client():
    """A client of the machine's Redis with the guard's library loaded; the keys the test made
    under its prefix (``redis_client.test_prefix``) are deleted afterwards."""
    require(redis_reason(), "Redis 7")
    import redis

    from lockd.guard.redis import install

    client = redis.Redis.from_url(REDIS_URL)
    install(client)
    client.test_prefix = f"guardtest:{uuid.uuid4().hex[:12]}:"
    yield client
    keys = list(client.scan_iter(match=client.test_prefix + "*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


from tests.client.conftest import lockd_server, shared_lockd  # noqa: E402,F401  (the same servers)
