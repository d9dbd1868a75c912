"""The PostgreSQL store's connections keep their socket registered with the event loop
(``resource_proxy.store.watched``), and a connection the server kills never leaves a stale
registration behind: a reused descriptor number is served normally, no descriptor leaks, and a
proxy whose backends are terminated under load keeps answering (never a 500).

The in-process tests run on uvloop (the proxy's loop) against a real PostgreSQL database and
read the loop's epoll interest set from ``/proc/self/fdinfo``.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import httpx
import psycopg
import pytest
import uvloop

from harness import wait_for, wait_for_async
from lockd.tokens import KeyRing
from resource_proxy.store.postgres import PostgresStore
from resource_proxy.store.watched import WatchedConnection
from tests.proxy.conftest import write_jwks


def _epoll_watched() -> set[int]:
    """The descriptors registered in any epoll instance of this process."""
    watched: set[int] = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != "anon_inode:[eventpoll]":
                continue
            info = Path(f"/proc/self/fdinfo/{fd}").read_text()
        except OSError:
            continue
        for line in info.splitlines():
            if line.startswith("tfd:"):
                watched.add(int(line.split()[1]))
    return watched


def _open_on(link: str) -> set[int]:
    """The descriptors of this process open on the file ``link`` names (``socket:[inode]``)."""
    return {fd for fd, target in _fd_links().items() if target == link}


def _open_fds(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _fd_links() -> dict[int, str]:
    links = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            links[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
    return links


def _terminate(admin_dsn: str, pid: int) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


def _same_socket(fd: int) -> set[int]:
    """The descriptors of this process open on the same socket as ``fd`` (its duplicates)."""
    target = os.readlink(f"/proc/self/fd/{fd}")
    found = set()
    for other in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{other}") == target:
                found.add(int(other))
        except OSError:
            continue
    return found


def test_a_pooled_connection_is_registered_once_and_stays_registered_while_idle(pg_dsn):
    async def main() -> None:
        store = PostgresStore(pg_dsn, {}, pool_size=1)
        await store.open()
        try:
            await store.ping()
            async with store._pool.connection() as conn:
                sock = _same_socket(conn.fileno())
            registered = _epoll_watched() & sock
            assert len(registered) == 1, (sock, registered)  # idle in the pool, still watched
            for _ in range(20):
                await store.ping()
                assert _epoll_watched() & sock == registered  # the same, never dropped
        finally:
            await store.close()
        assert not _epoll_watched() & registered  # closing the pool unregisters it

    uvloop.run(main())


def test_a_backend_killed_while_idle_leaves_no_stale_registration_and_no_leaked_descriptor(
        pg_dsn, pg_admin_dsn):
    async def main() -> None:
        conn = await WatchedConnection.connect(pg_dsn, autocommit=True)
        await conn.execute("SELECT 1")
        link = os.readlink(f"/proc/self/fd/{conn.pgconn.socket}")
        watch = conn._watch
        assert watch is not None and watch.fd in _epoll_watched()
        assert _open_on(link) == {conn.pgconn.socket, watch.fd}

        await asyncio.to_thread(_terminate, pg_admin_dsn, conn.info.backend_pid)
        # the EOF arrives while nobody waits: the watch steps aside
        await wait_for_async(lambda: not watch.registered, timeout=1, interval=0.01,
                             what="the watch to unregister")
        with pytest.raises(psycopg.OperationalError):
            await conn.execute("SELECT 1")
        assert conn.broken
        # libpq closed its socket itself; the duplicate went with it, unregistered first
        assert watch.fd == -1
        assert not _open_on(link)  # no descriptor left on the dead socket, so none registered

        # A new socket on the freed descriptor numbers is served normally by the loop.
        async def echo(reader, writer):
            writer.write(await reader.readline())
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        for i in range(5):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"ping %d\n" % i)
            assert await asyncio.wait_for(reader.readline(), 5) == b"ping %d\n" % i
            writer.close()
            await writer.wait_closed()
        server.close()
        await server.wait_closed()
        await conn.close()

        # And a new database connection (likely on the same number) works as well.
        again = await WatchedConnection.connect(pg_dsn, autocommit=True)
        for _ in range(5):
            assert await (await again.execute("SELECT 1")).fetchone() == (1,)
        again_link = os.readlink(f"/proc/self/fd/{again.pgconn.socket}")
        await again.close()
        assert not _open_on(again_link)

    uvloop.run(main())


def test_a_backend_killed_in_the_middle_of_a_query_releases_the_watch(pg_dsn, pg_admin_dsn):
    async def main() -> None:
        conn = await WatchedConnection.connect(pg_dsn, autocommit=True)
        link = os.readlink(f"/proc/self/fd/{conn.pgconn.socket}")
        pid = conn.info.backend_pid
        killer = asyncio.get_running_loop().call_later(
            0.3, lambda: threading.Thread(target=_terminate, args=(pg_admin_dsn, pid)).start())
        with pytest.raises(psycopg.OperationalError):
            await conn.execute("SELECT pg_sleep(30)")  # waiting on the watch when it dies
        killer.cancel()
        assert conn.broken and conn._watch is not None and conn._watch.fd == -1
        assert not _open_on(link)
        await conn.close()

    uvloop.run(main())


def test_the_proxy_keeps_serving_while_its_backends_are_terminated_under_load(
        pg_dsn, pg_admin_dsn, tmp_path, start_proxy):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id integer PRIMARY KEY, v text NOT NULL)")
        database = conn.info.dbname
    ring = KeyRing.generate()
    url, proc = start_proxy(pg_dsn, "--workers", "1", "--jwks-file",
                            str(write_jwks(tmp_path, ring)))
    pid = proc.proc.pid
    statuses: list[int] = []
    acknowledged: dict[int, str] = {}
    stop = threading.Event()

    def writer(n: int) -> None:
        token = {"Fencing-Token": ring.sign("items", 1)}  # no policy: lock = table
        with httpx.Client(base_url=url, timeout=30) as client:
            key = n * 1_000_000
            while not stop.is_set():
                key += 1
                response = client.put(f"/v1/tables/items/rows/{key}", json={"v": f"v{key}"},
                                      headers=token)
                statuses.append(response.status_code)
                if response.status_code == 200:
                    acknowledged[key] = f"v{key}"

    def backends() -> list[int]:
        with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
            return [row[0] for row in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND backend_type = "
                "'client backend' AND pid <> pg_backend_pid()", (database,))]

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: statuses.count(200) >= 100, timeout=30, what="writes before the kills")
        fds = _open_fds(pid)
        for _ in range(5):  # kill every backend of the proxy, five times over, under load
            for backend in backends():
                _terminate(pg_admin_dsn, backend)
            ok = statuses.count(200)
            wait_for(lambda ok=ok: statuses.count(200) >= ok + 50, timeout=30,
                     what="writes succeeding again after the kill")
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)

    assert set(statuses) <= {200, 502, 503}, sorted(set(statuses))
    assert httpx.put(f"{url}/v1/tables/items/rows/2000000000", json={"v": "last"},
                     headers={"Fencing-Token": ring.sign("items", 1)}).status_code == 200
    # every connection was replaced; the duplicates of the dead ones were closed
    wait_for(lambda: _open_fds(pid) <= fds + 2, timeout=10, what="descriptors back to normal")
    with psycopg.connect(pg_dsn) as conn:
        stored = dict(conn.execute("SELECT id, v FROM items").fetchall())
    assert all(stored.get(key) == value for key, value in acknowledged.items())
