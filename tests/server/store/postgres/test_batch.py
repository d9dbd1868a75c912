"""``PostgresStore`` sending the exclusive acquires and releases of one event-loop turn as one
statement (``locks.batch``), on a real PostgreSQL: each request's answer is the one it gets
alone, one request's failure stays its own, and a lock met twice in a turn is still granted
once at a time with strictly increasing fences.

Requests started together with ``asyncio.gather`` reach the store in one loop turn: the first
finds no other under way and is sent at once, alone; the others form one batch. ``stats``
(batches, requests in them, requests that ran alone) show that they did.
"""

from __future__ import annotations

import asyncio
import collections

import psycopg
import pytest

from harness import wait_for_async
from lockd.server.errors import LeaseLost, StoreUnavailable
from lockd.server.store.postgres import PostgresStore
from lockd.server.store.values import SHARED, SHARED_PREFIX, Grant, Holder
from tests.server.store.postgres.support import lease_id, opened, waiting_on_a_row_lock


async def acquire(store: PostgresStore, lock: str, owner: str = "t", ttl_ms: int = 5000,
                  client_id: str | None = None, lid: str | None = None) -> Grant | Holder:
    return await store.acquire(lock, lease_id=lid or lease_id(), ttl_ms=ttl_ms, owner=owner,
                               client_id=client_id)


def stats(store: PostgresStore) -> tuple[dict[str, int], dict[str, int]]:
    assert store._acquires is not None and store._releases is not None
    return dict(store._acquires.stats), dict(store._releases.stats)


def test_distinct_locks_granted_and_released_in_one_batch_each(pg_url):
    names = [f"d/{i}" for i in range(20)]

    async def main():
        async with opened(pg_url) as store:
            released: list[str] = []
            store.subscribe(released.append)
            got = await asyncio.gather(*(acquire(store, n, owner=n) for n in names))
            assert [(g.lock, g.fence, g.owner, g.ttl_ms) for g in got] == [
                (n, 1, n, 5000) for n in names]
            assert all(isinstance(g, Grant) for g in got)
            assert len({g.lease_id for g in got}) == len(names)
            acq, rel = stats(store)
            assert acq == {"batches": 1, "batched": 19, "failed": 0, "alone": 0}

            refused = await asyncio.gather(*(acquire(store, n) for n in names))
            assert [(h.lock, h.owner, h.fence) for h in refused] == [(n, n, 1) for n in names]
            assert all(isinstance(h, Holder) and 0 < h.ttl_ms <= 5000 for h in refused)

            await asyncio.gather(*(store.release(g.lock, g.lease_id) for g in got))
            acq, rel = stats(store)
            assert rel == {"batches": 1, "batched": 19, "failed": 0, "alone": 0}
            for n in names:
                state = await store.get(n)
                assert (state.held, state.fence) == (False, 1)
            await wait_for_async(lambda: sorted(released) == sorted(names), timeout=5)

            again = await asyncio.gather(*(acquire(store, n) for n in names))
            assert [(g.lock, g.fence) for g in again] == [(n, 2) for n in names]

    asyncio.run(main())


def test_one_lock_asked_many_times_in_a_turn_has_one_holder(pg_url):
    """16 requests on each of 4 locks in one turn: one grant per lock, the others refused by
    it. A lock's second request goes to a later batch: no batch statement fails."""

    async def main():
        async with opened(pg_url) as store:
            for round_ in range(1, 4):
                calls = [acquire(store, f"s/{i % 4}", owner=f"o{i}") for i in range(64)]
                got = await asyncio.gather(*calls)
                by_lock = collections.defaultdict(list)
                for answer in got:
                    by_lock[answer.lock].append(answer)
                assert sorted(by_lock) == [f"s/{i}" for i in range(4)]
                for lock, answers in by_lock.items():
                    grants = [a for a in answers if isinstance(a, Grant)]
                    assert len(grants) == 1, (lock, answers)
                    assert grants[0].fence == round_
                    assert all(a.owner == grants[0].owner and a.fence == round_
                               for a in answers if isinstance(a, Holder))
                    await store.release(lock, grants[0].lease_id)
                acq, _ = stats(store)
                assert acq["failed"] == 0 and acq["batches"] >= 1, acq

    asyncio.run(main())


def test_churn_on_few_locks_keeps_one_holder_and_increasing_fences(pg_url):
    """24 clients acquire and release 3 locks in a loop: never two holders at once, and each
    lock's fences strictly increase in the order the grants are answered."""

    async def main():
        async with opened(pg_url) as store:
            holder: dict[str, str | None] = {f"c/{i}": None for i in range(3)}
            fences: dict[str, list[int]] = {name: [] for name in holder}

            async def client(k: int) -> None:
                for i in range(30):
                    name = f"c/{(k + i) % 3}"
                    got = await acquire(store, name, owner=f"k{k}")
                    if isinstance(got, Grant):
                        assert holder[name] is None, (name, holder[name], k)
                        holder[name] = got.lease_id
                        fences[name].append(got.fence)
                        await asyncio.sleep(0)
                        holder[name] = None
                        await store.release(name, got.lease_id)

            await asyncio.gather(*(client(k) for k in range(24)))
            for name, seen in fences.items():
                assert seen and seen == sorted(set(seen)), (name, seen)
            acq, rel = stats(store)
            assert acq["batches"] > 0 and rel["batches"] > 0 and acq["failed"] == 0, (acq, rel)

    asyncio.run(main())


def test_a_client_id_retry_in_the_same_turn_gets_the_same_lease(pg_url):
    async def main():
        async with opened(pg_url) as store:
            first, retry, other = await asyncio.gather(
                acquire(store, "r/a", client_id="cli-1"), acquire(store, "r/a", client_id="cli-1"),
                acquire(store, "r/b", client_id="cli-1"))
            assert isinstance(first, Grant) and isinstance(retry, Grant), (first, retry)
            assert (retry.lease_id, retry.fence) == (first.lease_id, first.fence) == (
                first.lease_id, 1)
            assert isinstance(other, Grant) and other.fence == 1
            lid = lease_id()
            same, again = await asyncio.gather(acquire(store, "r/c", lid=lid),
                                               acquire(store, "r/c", lid=lid))
            assert isinstance(again, Grant) and (again.lease_id, again.fence) == (lid, 1)

    asyncio.run(main())


def test_a_failing_request_fails_alone(pg_url):
    """A TTL PostgreSQL cannot store fails the whole batch statement (nothing of it commits);
    every request then runs alone, so only that one fails. A refused release is a normal
    answer of its own, not a batch failure."""

    async def main():
        async with opened(pg_url) as store:
            calls = [acquire(store, f"f/{i}") for i in range(5)]
            calls.insert(2, acquire(store, "f/bad", ttl_ms=2**40))
            got = await asyncio.gather(*calls, return_exceptions=True)
            assert isinstance(got[2], StoreUnavailable), got[2]
            assert [(g.lock, g.fence) for g in got[:2] + got[3:]] == [
                (f"f/{i}", 1) for i in range(5)]
            acq, _ = stats(store)
            assert acq["failed"] == 5, acq  # f/0 went first, alone
            assert not (await store.get("f/bad")).held

            grants = [g for g in got if isinstance(g, Grant)]
            outcome = await asyncio.gather(
                *(store.release(g.lock, g.lease_id) for g in grants[:3]),
                store.release(grants[3].lock, lease_id()),  # not its lease
                store.release("f/\x00", lease_id()),  # a value PostgreSQL cannot take
                store.release(grants[4].lock, grants[4].lease_id),
                return_exceptions=True)
            assert outcome[:3] == [None] * 3 and outcome[5] is None, outcome
            assert isinstance(outcome[3], LeaseLost) and isinstance(outcome[4], StoreUnavailable)
            assert (await store.get(grants[3].lock)).held
            assert not any([(await store.get(g.lock)).held for g in grants[:3] + grants[4:]])
            _, rel = stats(store)
            assert rel["failed"] == 5, rel  # the NUL failed the statement: all ran alone

            more = [g for g in await asyncio.gather(*(acquire(store, f"g/{i}") for i in range(3)))]
            outcome = await asyncio.gather(store.release(more[0].lock, more[0].lease_id),
                                           store.release(more[1].lock, lease_id()),
                                           store.release(more[2].lock, more[2].lease_id),
                                           return_exceptions=True)
            assert outcome[0] is None and outcome[2] is None
            assert isinstance(outcome[1], LeaseLost)
            _, rel2 = stats(store)
            assert rel2["failed"] == rel["failed"] and rel2["alone"] == rel["alone"] + 1

    asyncio.run(main())


def test_switched_off_each_request_alone(pg_url):
    async def main():
        async with opened(pg_url + "?batch=0") as store:
            assert store._acquires is None and store._releases is None
            got = await asyncio.gather(*(acquire(store, "o/a") for _ in range(4)))
            assert sum(isinstance(g, Grant) for g in got) == 1

    asyncio.run(main())


def test_batch_survives_a_connection_killed_mid_statement(pg_url, pg_dsn):
    """The batch's backend is terminated while its statement waits on a row lock: the batch is
    retried once on a fresh connection (``_run``) and every request gets its own answer."""

    async def main():
        async with opened(pg_url) as store:
            await acquire(store, "k/0")  # the row exists, so a transaction can lock it
            await store.force_release("k/0")
            blocker = await psycopg.AsyncConnection.connect(pg_dsn)
            await blocker.execute("SELECT 1 FROM lockd.locks WHERE name = 'k/0' FOR UPDATE")
            batch = asyncio.gather(*(acquire(store, f"k/{i}") for i in range(4)))
            await wait_for_async(lambda: asyncio.to_thread(waiting_on_a_row_lock, pg_dsn),
                                 timeout=5)
            with psycopg.connect(pg_dsn, autocommit=True) as admin:
                killed = admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                ).fetchall()
            assert killed == [(True,)]
            await wait_for_async(lambda: asyncio.to_thread(waiting_on_a_row_lock, pg_dsn),
                                 timeout=5)  # the retry, on a new connection
            await blocker.rollback()
            await blocker.close()
            got = await batch
            assert [(g.lock, g.fence) for g in got] == [("k/0", 2)] + [
                (f"k/{i}", 1) for i in range(1, 4)]
            assert all(isinstance(g, Grant) for g in got)

    asyncio.run(main())


@pytest.mark.parametrize("bad", ["", "x"])
def test_batch_url_parameter_is_checked(pg_url, bad):
    with pytest.raises(ValueError, match="batch"):
        PostgresStore(pg_url + f"?batch={bad}")


class _CutAfterCommit:
    """A TCP relay to PostgreSQL that, once armed, lets the first statement containing
    ``marker`` through and closes that connection when the server answers it: the statement
    committed (an autocommit statement's answer is sent after its commit) but its caller never
    hears so. Later connections are relayed untouched."""

    def __init__(self, port: int, marker: bytes):
        self._port, self._marker = port, marker
        self.armed = False
        self.cuts = 0
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._port)
        sent = asyncio.Event()

        async def to_server() -> None:
            while data := await reader.read(65536):
                if self.armed and self._marker in data:
                    self.armed = False
                    sent.set()
                up_writer.write(data)
                await up_writer.drain()

        async def to_client() -> None:
            while data := await up_reader.read(65536):
                if sent.is_set():  # the answer to the marked statement: drop it, cut
                    self.cuts += 1
                    return
                writer.write(data)
                await writer.drain()

        try:
            tasks = [asyncio.ensure_future(to_server()), asyncio.ensure_future(to_client())]
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in tasks:
                task.cancel()
        finally:
            writer.close()
            up_writer.close()


@pytest.mark.parametrize("marker", [b"AS r(name, lease_id, owner", b"AS q(name, lease_id)"],
                         ids=["acquires", "releases"])
def test_batch_whose_commit_was_not_heard_is_retried_without_a_second_effect(pg_url, marker):
    """The batch statement commits but its answer is lost with its connection: the retry
    (``_run``) must not grant again (fences stay 1, same lease ids) nor call the committed
    releases lost (each is checked against its first attempt: released by its lease id)."""
    host_port = pg_url.split("@", 1)[1].split("/", 1)[0]
    pg_port = int(host_port.rsplit(":", 1)[1])

    async def main():
        relay = _CutAfterCommit(pg_port, marker)
        port = await relay.start()
        url = pg_url.replace(host_port, f"127.0.0.1:{port}") + "?prepare_threshold=none"
        try:
            async with opened(url) as store:
                names = [f"x/{i}" for i in range(5)]
                lids = [lease_id() for _ in names]
                relay.armed = marker.startswith(b"AS r(")
                got = await asyncio.gather(*(acquire(store, n, lid=lid)
                                             for n, lid in zip(names, lids, strict=True)))
                assert [(g.lock, g.lease_id, g.fence) for g in got] == [
                    (n, lid, 1) for n, lid in zip(names, lids, strict=True)]
                relay.armed = not relay.armed and relay.cuts == 0
                await asyncio.gather(*(store.release(n, lid)
                                       for n, lid in zip(names, lids, strict=True)))
                assert relay.cuts == 1
                for n in names:
                    state = await store.get(n)
                    assert (state.held, state.fence) == (False, 1)
                acq, rel = stats(store)
                assert acq["failed"] == 0 and rel["failed"] == 0, (acq, rel)
                if marker.startswith(b"AS q("):
                    assert rel["alone"] == len(names) - 1, rel  # the retry freed none: each checked
        finally:
            await relay.close()

    asyncio.run(main())


def test_renewals_of_one_turn_share_one_statement_and_each_keeps_its_own_answer(pg_url):
    """What ``renew-each`` sends: many renewals at once. The live exclusive leases are renewed
    by one statement (their own fence and owner, the TTL asked or their own); a released lease
    and a shared one in the same turn are asked again alone, which says which."""
    names = [f"r/{i}" for i in range(12)]

    async def main():
        async with opened(pg_url) as store:
            got = await asyncio.gather(*(acquire(store, n, owner=n, ttl_ms=4000) for n in names))
            shared = await store.acquire("r/shared", lease_id=SHARED_PREFIX + lease_id(), ttl_ms=4000,
                                         owner="reader", client_id=None, mode=SHARED)
            assert isinstance(shared, Grant)
            await store.release(got[5].lock, got[5].lease_id)
            before = store._renewals.stats.copy()
            ttls = [None if i % 2 else 20_000 for i in range(len(names))]
            outcomes = await asyncio.gather(
                *(store.renew(g.lock, g.lease_id, t) for g, t in zip(got, ttls, strict=True)),
                store.renew("r/shared", shared.lease_id, 20_000), return_exceptions=True)
            assert isinstance(outcomes[5], LeaseLost)
            for i, (g, t, out) in enumerate(zip(got, ttls, outcomes[:-1], strict=True)):
                if i == 5:
                    continue
                assert isinstance(out, Grant), out
                assert (out.lock, out.lease_id, out.fence, out.owner) == (
                    g.lock, g.lease_id, g.fence, g.lock)
                assert 15_000 < out.ttl_ms <= 20_000 if t else 0 < out.ttl_ms <= 4000
                state = await store.get(g.lock)
                assert state.held and (15_000 < state.ttl_ms if t else state.ttl_ms <= 4000)
            assert isinstance(outcomes[-1], Grant) and outcomes[-1].ttl_ms > 15_000
            after = store._renewals.stats
            # the first renewal went alone (nothing else under way); the released lease left
            # the batch to be answered alone (a shared lease's id never joins a batch)
            assert after["batches"] - before["batches"] == 1, after
            assert after["batched"] - before["batched"] == len(names) - 1, after
            assert after["alone"] - before["alone"] == 1 and after["failed"] == 0, after

    asyncio.run(main())
