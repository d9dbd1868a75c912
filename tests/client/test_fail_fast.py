"""A client that cannot reach its server fails fast: ``TransportError`` within the connect
budget (``connect_timeout``, default ``DEFAULT_CONNECT_TIMEOUT`` seconds), also in a waiting
acquire, without the transport's chained traceback; keep-retrying is the opt-in
``connect_timeout=None``."""

from __future__ import annotations

import asyncio
import threading
import time
import traceback

import pytest

from harness import free_port
from lockd.client import AsyncLockClient, LockClient
from lockd.client.errors import LockClientError, TransportError
from lockd.client.fenced import FencedSession
from lockd.client.wire import DEFAULT_CONNECT_TIMEOUT

BUDGET = 0.5  # seconds: a short connect budget keeps the tests fast
SLACK = 2.0  # seconds of scheduling slack on a busy 2-core machine


def _closed_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


def _assert_clean(exc: TransportError) -> None:
    assert isinstance(exc, LockClientError)
    assert exc.__cause__ is None and exc.__suppress_context__
    assert exc.cause is not None  # the transport's own exception stays available
    printed = "".join(traceback.format_exception(exc))
    assert "httpx" not in printed and "httpcore" not in printed, printed


def test_default_connect_budget_is_documented_and_bounded():
    assert 0 < DEFAULT_CONNECT_TIMEOUT <= 10
    assert LockClient(_closed_url()).connect_timeout == DEFAULT_CONNECT_TIMEOUT


@pytest.mark.parametrize("how", ["acquire", "lock", "acquire_wait"])
def test_sync_client_against_a_closed_port_raises_within_the_budget(how):
    with LockClient(_closed_url(), connect_timeout=BUDGET) as client:
        started = time.monotonic()
        with pytest.raises(TransportError) as caught:
            if how == "acquire":
                client.acquire("ff/x", ttl=10)  # wait=None: forever, but lockd is not there
            elif how == "lock":
                client.lock("ff/x", ttl=10).acquire()
            else:
                client.acquire("ff/x", ttl=10, wait=60)
        took = time.monotonic() - started
    assert BUDGET * 0.8 <= took < BUDGET + SLACK, took
    assert "cannot reach" in str(caught.value)
    _assert_clean(caught.value)


def test_default_budget_applies_without_any_argument():
    with LockClient(_closed_url()) as client:
        started = time.monotonic()
        with pytest.raises(TransportError):
            client.acquire("ff/y", ttl=10)
        assert time.monotonic() - started < DEFAULT_CONNECT_TIMEOUT + SLACK


def test_async_client_against_a_closed_port_raises_within_the_budget():
    async def main() -> float:
        async with AsyncLockClient(_closed_url(), connect_timeout=BUDGET) as client:
            started = time.monotonic()
            with pytest.raises(TransportError) as caught:
                await client.acquire("ff/z", ttl=10)
            _assert_clean(caught.value)
            return time.monotonic() - started

    assert asyncio.run(main()) < BUDGET + SLACK


def test_fenced_session_against_a_closed_port_raises_at_once_and_clean():
    with FencedSession(_closed_url(), connect_timeout=BUDGET) as db:
        started = time.monotonic()
        with pytest.raises(TransportError) as caught:
            db.lock_for("accounts", 7)
        assert time.monotonic() - started < BUDGET + SLACK
    _assert_clean(caught.value)


def test_keep_retrying_is_an_explicit_choice():
    """``connect_timeout=None`` keeps retrying while the server is unreachable (the old way):
    the acquire is still waiting well after the default budget would have raised."""
    result: list[object] = []
    client = LockClient(_closed_url(), connect_timeout=None)

    def run() -> None:
        try:
            client.acquire("ff/w", ttl=10, wait=BUDGET * 4)
        except Exception as exc:  # noqa: BLE001 - recorded for the assertion
            result.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(timeout=30)
    took = time.monotonic() - started
    client.close()
    assert result and isinstance(result[0], TransportError)
    assert took >= BUDGET * 4 * 0.9, took  # it kept trying for the whole wait
