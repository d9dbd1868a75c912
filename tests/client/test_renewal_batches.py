"""Background renewals batched per client (``lockd.client.renewals``): a client holding many
lock leases keeps them alive with ``POST /v1/leases/renew-each`` requests, not one request per
lease, and a lease lockd has lost is answered (and marked lost) on its own. Real lockd; the
requests are read off httpx's own event hook."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import httpx

from harness import wait_for, wait_for_async
from lockd import AsyncLockClient, LeaseRef, LeaseState, LockClient

LEASES = 12
TTL = 1.5  # renewals every 0.5 s


class _Paths:
    """The path of every request the client sent (thread-safe)."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self._mutex = threading.Lock()

    def __call__(self, request: httpx.Request) -> None:
        with self._mutex:
            self.paths.append(request.url.path)

    def count(self, predicate) -> int:
        with self._mutex:
            return sum(1 for p in self.paths if predicate(p))


def _check_batched(paths: _Paths, leases: list, lost: object) -> None:
    batched = paths.count(lambda p: p == "/v1/leases/renew-each")
    single = paths.count(lambda p: p.endswith("/renew") and p.startswith("/v1/locks/"))
    assert batched >= 2, paths.paths
    # Every lease renewed (the live ones at least once, the lost one asked), with fewer
    # requests than one tick of single renewals would take: one request per tick, or a few.
    assert single == 0 and batched < LEASES, paths.paths
    for lease in leases:
        if lease is lost:
            assert lease.state is LeaseState.LOST and lease.lost.is_set()
        else:
            assert lease.state is LeaseState.RENEWED, (lease.lock, lease.state)


def test_sync_client_renews_its_leases_in_one_request_per_tick(shared_lockd, name):
    paths = _Paths()
    http = httpx.Client(event_hooks={"request": [paths]})
    with LockClient(shared_lockd.url, http_client=http) as client, LockClient(
            shared_lockd.url) as other:
        leases = [client.acquire(f"{name}/{i}", TTL) for i in range(LEASES)]
        # Another party ends one lease at lockd: only that lease is lost, at its next renewal.
        lost = leases[3]
        other.release(LeaseRef(lost.lock, lost.lease_id))
        wait_for(lambda: lost.state is LeaseState.LOST, timeout=10, what="the released lease lost")
        wait_for(lambda: all(lease.state is LeaseState.RENEWED for lease in leases
                             if lease is not lost), timeout=10, what="the others renewed")
        wait_for(lambda: paths.count(lambda p: p == "/v1/leases/renew-each") >= 2, timeout=10,
                 what="a second batched tick")
        _check_batched(paths, leases, lost)
        for lease in leases:
            if lease is not lost:
                lease.release()
    http.close()


def test_async_client_renews_its_leases_in_one_request_per_tick(shared_lockd, name):
    paths = _Paths()

    async def record(request: httpx.Request) -> None:
        paths(request)

    async def main() -> None:
        http = httpx.AsyncClient(event_hooks={"request": [record]})
        async with AsyncLockClient(shared_lockd.url, http_client=http) as client, \
                AsyncLockClient(shared_lockd.url) as other:
            leases = [await client.acquire(f"{name}/{i}", TTL) for i in range(LEASES)]
            lost = leases[5]
            await other.release(LeaseRef(lost.lock, lost.lease_id))
            with contextlib.suppress(TimeoutError):  # _check_batched says what was missing
                await wait_for_async(
                    lambda: (lost.state is LeaseState.LOST
                             and all(lease.state is LeaseState.RENEWED
                                     for lease in leases if lease is not lost)
                             and paths.count(lambda p: p == "/v1/leases/renew-each") >= 2),
                    timeout=10, what="one lease lost, the others renewed in batches")
            _check_batched(paths, leases, lost)
            for lease in leases:
                if lease is not lost:
                    await lease.release()
        await http.aclose()

    asyncio.run(main())


_OLD_PATH = "/v1/leases/renew-each-predates-this-lockd"


class _Older(httpx.HTTPTransport):
    """A lockd that predates ``renew-each``: the request goes to a path the real lockd does not
    serve, so lockd itself answers 404 for it."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/leases/renew-each":
            request.url = request.url.copy_with(path=_OLD_PATH)
        return super().handle_request(request)


class _AsyncOlder(httpx.AsyncHTTPTransport):
    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/leases/renew-each":
            request.url = request.url.copy_with(path=_OLD_PATH)
        return await super().handle_async_request(request)


def _check_fell_back(paths: _Paths, leases: list, ticks: int) -> None:
    """``renew-each`` was tried (once, or once per batch already open when the first 404 came
    back) and every renewal since went alone: the last ``ticks`` ticks hold no ``renew-each``."""
    with paths._mutex:
        seen = list(paths.paths)
    each = [i for i, p in enumerate(seen) if p == "/v1/leases/renew-each"]
    single = [i for i, p in enumerate(seen) if p.endswith("/renew") and p.startswith("/v1/locks/")]
    assert 1 <= len(each) <= 2, seen
    assert len(single) >= (ticks + 1) * len(leases), seen
    assert each[-1] < single[-ticks * len(leases)], seen
    assert all(lease.state is LeaseState.RENEWED for lease in leases)


def test_a_lockd_without_renew_each_is_asked_one_lease_at_a_time_from_then_on(shared_lockd,
                                                                                   name):
    paths = _Paths()
    http = httpx.Client(transport=_Older(), event_hooks={"request": [paths]})
    with LockClient(shared_lockd.url, http_client=http) as client:
        leases = [client.acquire(f"{name}/{i}", TTL) for i in range(4)]
        renews = lambda: paths.count(lambda p: p.endswith("/renew"))  # noqa: E731
        wait_for(lambda: renews() >= 3 * len(leases), timeout=10, what="three ticks of renewals")
        _check_fell_back(paths, leases, ticks=2)
        for lease in leases:
            lease.release()
    http.close()


def test_the_async_client_falls_back_the_same_way(shared_lockd, name):
    paths = _Paths()

    async def record(request: httpx.Request) -> None:
        paths(request)

    async def main() -> None:
        http = httpx.AsyncClient(transport=_AsyncOlder(), event_hooks={"request": [record]})
        async with AsyncLockClient(shared_lockd.url, http_client=http) as client:
            leases = [await client.acquire(f"{name}/{i}", TTL) for i in range(4)]
            await wait_for_async(
                lambda: paths.count(lambda p: p.endswith("/renew")) >= 3 * len(leases),
                timeout=10, what="three ticks of renewals")
            _check_fell_back(paths, leases, ticks=2)
            for lease in leases:
                await lease.release()
        await http.aclose()

    asyncio.run(main())


def test_aclose_cancels_a_batch_in_flight_so_no_request_outlives_the_client(shared_lockd, name):
    """A ``renew-each`` held on its way out (an async request hook that waits) when the client
    closes: ``aclose`` cancels it, so no task of the client is left to send on a closed pool."""
    sent = _Paths()

    async def main() -> None:
        entered, held = asyncio.Event(), asyncio.Event()

        async def hold(request: httpx.Request) -> None:
            if request.url.path == "/v1/leases/renew-each":
                entered.set()
                await held.wait()
            sent(request)

        http = httpx.AsyncClient(event_hooks={"request": [hold]})
        client = AsyncLockClient(shared_lockd.url, http_client=http)
        leases = [await client.acquire(f"{name}/{i}", TTL) for i in range(3)]
        await asyncio.wait_for(entered.wait(), timeout=10)
        await client.aclose()
        flushing = [task for task in asyncio.all_tasks()
                    if "_flush" in getattr(task.get_coro(), "__qualname__", "")]
        held.set()
        await asyncio.sleep(0)  # one loop turn: a surviving batch would now send
        assert flushing == [], flushing
        assert sent.count(lambda p: p == "/v1/leases/renew-each") == 0, sent.paths
        async with AsyncLockClient(shared_lockd.url) as other:
            for lease in leases:
                await other.release(LeaseRef(lease.lock, lease.lease_id))
        await http.aclose()

    asyncio.run(main())
