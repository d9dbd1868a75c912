"""The load generator: one asyncio (uvloop) process per measurement, the same for every peer.

Every peer is driven the same way: ``clients`` coroutines, each with its own connection, run
one *cycle* after another (closed loop) for ``warmup`` seconds (not counted) and then for
``seconds`` (counted); each cycle's latency is recorded. What a cycle is depends on the peer
(``WORKLOADS``): two HTTP requests for lockd (acquire + release), four for etcd's lock API
(lease grant + lock + unlock + revoke), redis-py's ``Lock.acquire`` + ``release``, psycopg's
``pg_try_advisory_lock`` + ``pg_advisory_unlock``, one fenced write through the proxy, and so on.

HTTP peers (lockd, etcd's JSON gateway, the proxy, the do-nothing servers) are spoken to with
``Http``: a minimal HTTP/1.1 keep-alive client over asyncio streams. It costs the generator far
less CPU per request than httpx, which matters on two cores shared with the servers; the
generator's own ceiling is measured against a do-nothing server (``noop``) in every run.

``run(kind, spec)`` executes one job in a fresh ``spawn``-ed process (the servers are other
processes too) and returns its JSON-able result. ``procs`` > 1 splits the clients over several
generator processes that start counting together.

The scenario jobs besides the closed loop (``bench.jobs``: ``handoff``, ``takeover_wait``,
``renewals``, ``fill``, ``probe``, ``queue_load``; section 9's in ``bench.primitives``) also run
in their own process through ``run``.
"""

from __future__ import annotations

import asyncio
import base64
import importlib
import json
import multiprocessing
import os
import signal
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench import cpu

__all__ = ["Http", "HttpError", "WORKLOADS", "run", "closed_loop"]

Cycle = Callable[[], Awaitable[None]]


# --- a minimal keep-alive HTTP/1.1 client -------------------------------------------------------


class HttpError(Exception):
    """A non-2xx answer (``status``, ``body``) or a broken connection."""

    def __init__(self, status: int, body: bytes = b""):
        super().__init__(f"HTTP {status}: {body[:200]!r}")
        self.status = status
        self.body = body


class Http:
    """One keep-alive HTTP/1.1 connection; requests on it are sequential. ``tls``: an
    ``ssl.SSLContext`` for an https server (the handshake is paid on each ``connect``)."""

    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None = None):
        self.host, self.port, self.tls = host, port, tls
        self._r: asyncio.StreamReader | None = None
        self._w: asyncio.StreamWriter | None = None

    async def connect(self) -> Http:
        self._r, self._w = await asyncio.open_connection(
            self.host, self.port, ssl=self.tls,
            server_hostname=self.host if self.tls is not None else None)
        return self

    async def close(self) -> None:
        if self._w is not None:
            self._w.close()
            try:
                await self._w.wait_closed()
            except OSError:
                pass
            self._w = None

    async def request(self, method: str, path: str, body: bytes | None = None,
                      headers: str = "") -> tuple[int, bytes]:
        """Send one request, return (status, body). Raises ``HttpError(0)`` if the connection
        closed."""
        if self._w is None:
            await self.connect()
        assert self._r is not None and self._w is not None
        if body is None:
            head = f"{method} {path} HTTP/1.1\r\nHost: b\r\n{headers}\r\n"
            self._w.write(head.encode())
        else:
            head = (f"{method} {path} HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n{headers}\r\n")
            self._w.write(head.encode() + body)
        try:
            raw = await self._r.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            self._w = None
            raise HttpError(0, str(exc).encode()) from None
        status = int(raw[9:12])
        length = 0
        chunked = False
        for line in raw.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        if chunked:
            data = bytearray()
            while True:
                size = int((await self._r.readuntil(b"\r\n")).split(b";")[0], 16)
                chunk = await self._r.readexactly(size + 2)
                if size == 0:
                    break
                data += chunk[:-2]
            return status, bytes(data)
        return status, (await self._r.readexactly(length) if length else b"")

    async def json(self, method: str, path: str, doc: Any = None, headers: str = "",
                   ok: tuple[int, ...] = (200,)) -> Any:
        body = None if doc is None else json.dumps(doc, separators=(",", ":")).encode()
        status, data = await self.request(method, path, body, headers)
        if status not in ok:
            raise HttpError(status, data)
        return json.loads(data) if data else None


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# --- workloads: one cycle of each peer ------------------------------------------------------------


async def _noop(spec: dict, i: int) -> tuple[Cycle, Callable[[], Awaitable[None]]]:
    """Two requests to a do-nothing HTTP server (the generator's or the stack's ceiling)."""
    http = await Http(spec["host"], spec["port"]).connect()
    per_cycle = spec.get("requests_per_cycle", 2)

    async def cycle() -> None:
        for _ in range(per_cycle):
            status, _ = await http.request("GET", "/noop")
            if status != 200:
                raise HttpError(status)

    return cycle, http.close


def _tls(spec: dict) -> ssl.SSLContext | None:
    """A client context trusting ``spec["tls_ca"]`` (a CA file), or None for plain http."""
    ca = spec.get("tls_ca")
    return ssl.create_default_context(cafile=ca) if ca else None


async def _lockd(spec: dict, i: int) -> tuple[Cycle, Callable[[], Awaitable[None]]]:
    """lockd: acquire (try once) + release of this client's own lock. ``tls_ca``: over https;
    ``reconnect``: a new connection (so a new TLS handshake) for every cycle; ``replicas``:
    ``[[host, port], ...]`` of lockd processes on one store, client ``i`` talking to replica
    ``i % len(replicas)`` (round-robin, so the clients split evenly)."""
    replicas = spec.get("replicas") or [[spec["host"], spec["port"]]]
    host, port = replicas[i % len(replicas)]
    http = await Http(host, port, _tls(spec)).connect()
    name = f"{spec.get('prefix', 'bench')}/c{i}"
    acquire = json.dumps({"ttl_ms": spec.get("ttl_ms", 30_000), "owner": f"c{i}"}).encode()
    reconnect = bool(spec.get("reconnect"))

    async def cycle() -> None:
        if reconnect:
            await http.close()
            await http.connect()
        status, data = await http.request("POST", f"/v1/locks/{name}/acquire", acquire)
        if status != 200:
            raise HttpError(status, data)
        lease_id = json.loads(data)["lease_id"]
        status, data = await http.request("POST", f"/v1/locks/{name}/release",
                                          b'{"lease_id":"' + lease_id.encode() + b'"}')
        if status != 200:
            raise HttpError(status, data)

    return cycle, http.close


async def _lockd_many(spec: dict, i: int) -> tuple[Cycle, Callable[[], Awaitable[None]]]:
    """lockd multi-lock lease: ``POST /v1/leases/acquire`` of ``locks`` locks of this client's
    own (try once) + ``/v1/leases/release``: 2 requests a cycle, like ``_lockd``."""
    http = await Http(spec["host"], spec["port"], _tls(spec)).connect()
    names = [f"{spec.get('prefix', 'bench')}/c{i}/k{k}" for k in range(spec["locks"])]
    acquire = json.dumps({"locks": names, "ttl_ms": spec.get("ttl_ms", 30_000),
                          "owner": f"c{i}"}).encode()

    async def cycle() -> None:
        status, data = await http.request("POST", "/v1/leases/acquire", acquire)
        if status != 200:
            raise HttpError(status, data)
        lease_id = json.loads(data)["lease_id"]
        status, data = await http.request("POST", "/v1/leases/release",
                                          b'{"lease_id":"' + lease_id.encode() + b'"}')
        if status != 200:
            raise HttpError(status, data)

    return cycle, http.close


async def _etcd(spec: dict, i: int) -> tuple[Cycle, Callable[[], Awaitable[None]]]:
    """etcd's lock API through its gateway: lease grant + lock + unlock + lease revoke."""
    http = await Http(spec["host"], spec["port"]).connect()
    name = _b64(f"{spec.get('prefix', 'bench')}/c{i}")
    ttl = spec.get("etcd_ttl_s", 30)

    async def cycle() -> None:
        lease = (await http.json("POST", "/v3/lease/grant", {"TTL": ttl}))["ID"]
        key = (await http.json("POST", "/v3/lock/lock", {"name": name, "lease": lease}))["key"]
        await http.json("POST", "/v3/lock/unlock", {"key": key})
        await http.json("POST", "/v3/lease/revoke", {"ID": lease})

    return cycle, http.close


async def _redis(spec: dict, i: int) -> tuple[Cycle, Callable[[], Awaitable[None]]]:
    """redis-py's asyncio ``Lock``: acquire (non-blocking) + release."""
    import redis.asyncio as aioredis

    client = aioredis.Redis(host=spec.get("host", "127.0.0.1"), port=spec.get("port", 6379),
                            single_connection_client=True)
    lock = client.lock(f"{spec['prefix']}/c{i}", timeout=spec.get("ttl_ms", 30_000) / 1000)

    async def cycle() -> None:
        if not await lock.acquire(blocking=False):
            raise HttpError(409, b"redis lock held")
        await lock.release()

    async def close() -> None:
        await client.aclose()

    return cycle, close


async def _pg_connect(spec: dict):
    import psycopg

    return await psycopg.AsyncConnection.connect(spec["dsn"], autocommit=True,
                                                 prepare_threshold=0)


async def _pgadv(spec: dict, i: int) -> tuple[Cycle, Callable[[], Awaitable[None]]]:
    """PostgreSQL advisory lock: ``pg_try_advisory_lock`` + ``pg_advisory_unlock`` (psycopg)."""
    conn = await _pg_connect(spec)
    key = spec.get("key_base", 7_000_000) + i

    async def cycle() -> None:
        cur = await conn.execute("SELECT pg_try_advisory_lock(%s)", (key,))
        if not (await cur.fetchone())[0]:
            raise HttpError(409, b"advisory lock held")
        cur = await conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
        await cur.fetchone()

    return cycle, conn.close


async def _proxy_write(spec: dict, i: int) -> tuple[Cycle, Callable[[], Awaitable[None]]]:
    """One fenced single-row write through the proxy: ``PUT /v1/tables/T/rows/{i}``.

    With ``fresh_tokens`` (per client, fences increasing) every write presents a token the
    proxy has not seen yet, as the first write of each new lease does (no verification cache).
    """
    http = await Http(spec["host"], spec["port"]).connect()
    fresh = spec["fresh_tokens"][i] if spec.get("fresh_tokens") else None
    headers = f"Fencing-Token: {spec['tokens'][i]}\r\n" if fresh is None else ""
    path = f"/v1/tables/{spec['table']}/rows/{spec.get('row_base', 0) + i}"
    n = 0

    async def cycle() -> None:
        nonlocal n
        n += 1
        head = headers if fresh is None else f"Fencing-Token: {fresh[min(n, len(fresh)) - 1]}\r\n"
        status, data = await http.request("PUT", path, b'{"v":%d}' % n, head)
        if status != 200:
            raise HttpError(status, data)

    return cycle, http.close


async def _proxy_batch(spec: dict, i: int) -> tuple[Cycle, Callable[[], Awaitable[None]]]:
    """One fenced batch of ``batch`` upserts through the proxy (``POST /v1/batch``). ``grouped``:
    the table's key is (group, id) and client ``i`` writes group ``i`` (one lock per group)."""
    http = await Http(spec["host"], spec["port"]).connect()
    headers = f"Fencing-Token: {spec['tokens'][i]}\r\n"
    size = spec["batch"]
    base = spec.get("key_base", 1_000_000) + i * size
    n = 0

    async def cycle() -> None:
        nonlocal n
        n += 1
        ops = [{"op": "upsert", "table": spec["table"],
                "key": [i, j] if spec.get("grouped") else base + j, "row": {"v": n}}
               for j in range(size)]
        status, data = await http.request("POST", "/v1/batch",
                                          json.dumps({"ops": ops}).encode(), headers)
        if status != 200:
            raise HttpError(status, data)

    return cycle, http.close


async def _direct_sql(spec: dict, i: int) -> tuple[Cycle, Callable[[], Awaitable[None]]]:
    """One statement straight to PostgreSQL with psycopg (prepared after the first use)."""
    import psycopg

    conn = await psycopg.AsyncConnection.connect(spec["dsn"], autocommit=True,
                                                 prepare_threshold=1)
    sql = spec["sql"][i] if isinstance(spec["sql"], list) else spec["sql"]
    params = spec["params"][i]
    counter = spec.get("counter")  # name of a parameter to bump every cycle (the new value)
    n = 0

    async def cycle() -> None:
        nonlocal n
        n += 1
        if counter:
            params[counter] = n
        cur = await conn.execute(sql, params)
        row = await cur.fetchone()
        check = spec.get("check_first")
        if check is not None and (row is None or row[0] != check[i]):
            raise HttpError(409, f"direct statement refused: {row}".encode())

    return cycle, conn.close


async def _lockd_sql(spec: dict, i: int) -> tuple[Cycle, Callable[[], Awaitable[None]]]:
    """lockd's own grant and release statements (``lockd.server.store.postgres.sql``) sent straight
    to PostgreSQL with psycopg on this client's own lock row: the database's limit for what
    one lockd cycle asks of it (2 autocommit statements, prepared after the first use)."""
    import psycopg

    from lockd.server.store.postgres import sql as pg

    conn = await psycopg.AsyncConnection.connect(spec["dsn"], autocommit=True,
                                                 prepare_threshold=1)
    lock = f"{spec.get('prefix', 'bench')}/c{i}"
    n = 0

    async def cycle() -> None:
        nonlocal n
        n += 1
        lease_id = f"c{i}.{n}"
        cur = await conn.execute(pg.ACQUIRE, {
            "lock": lock, "lease_id": lease_id, "owner": f"c{i}", "client_id": None,
            "ttl_ms": 30_000})
        row = await cur.fetchone()
        if row is None or not row[0]:
            raise HttpError(409, f"grant refused: {row}".encode())
        await conn.execute(pg.RELEASE, {"lock": lock, "lease_id": lease_id})

    return cycle, conn.close


async def _sql_floor(spec: dict, i: int) -> tuple[Cycle, Callable[[], Awaitable[None]]]:
    from bench.sql_floor import fenced_tx_floor

    return await fenced_tx_floor(spec, i)


async def _fenced_tx(spec: dict, i: int) -> tuple[Cycle, Callable[[], Awaitable[None]]]:
    """``async_fenced_transaction`` on a psycopg connection: verify the client's token offline
    (``jwks``, parsed once), BEGIN and ``fencing.claim`` of its lock (one message on psycopg),
    the client's UPDATE (the row's fence trigger checks the claim), COMMIT: what an application
    pays to fence its own SQL."""
    import psycopg

    from lockd import async_fenced_transaction
    from lockd.tokens import Verifier

    conn = await psycopg.AsyncConnection.connect(spec["dsn"], prepare_threshold=1)
    verifier = Verifier(spec["jwks"])
    token, sql, params = spec["tokens"][i], spec["sql"], spec["params"][i]
    n = 0

    async def cycle() -> None:
        nonlocal n
        n += 1
        params["v"] = n
        async with async_fenced_transaction(conn, token, jwks=verifier):
            cur = await conn.execute(sql, params)
            if await cur.fetchone() is None:
                raise HttpError(404, f"row {params} not updated".encode())

    await cycle()  # the session's first claim compiles its PL/pgSQL: not a measured cycle
    return cycle, conn.close


WORKLOADS: dict[str, Callable[[dict, int], Awaitable[tuple[Cycle, Callable[[], Awaitable[None]]]]]] = {
    "noop": _noop,
    "lockd": _lockd,
    "lockd_many": _lockd_many,
    "etcd": _etcd,
    "redis": _redis,
    "pgadv": _pgadv,
    "proxy_write": _proxy_write,
    "proxy_batch": _proxy_batch,
    "direct_sql": _direct_sql,
    "fenced_tx": _fenced_tx,
    "fenced_tx_floor": lambda spec, i: _sql_floor(spec, i),
    "lockd_sql": _lockd_sql,
}

from bench.transfer import WORKLOADS as _TRANSFER_WORKLOADS  # noqa: E402 - section 8

WORKLOADS.update(_TRANSFER_WORKLOADS)

from bench.objects import WORKLOADS as _OBJECT_WORKLOADS  # noqa: E402 - section 10

WORKLOADS.update(_OBJECT_WORKLOADS)


# --- the closed loop ----------------------------------------------------------------------------


async def make_clients(spec: dict, client_ids: list[int]) -> list:
    """Set up one client of ``spec["workload"]`` per id: ``[(cycle, close), ...]``."""
    make = WORKLOADS[spec["workload"]]
    return list(await asyncio.gather(*(make(spec, i) for i in client_ids)))


async def closed_loop(spec: dict, client_ids: list[int], start_at: float | None = None,
                      made: list | None = None) -> dict:
    """Run ``spec["workload"]`` with one coroutine per id in ``client_ids``.

    ``spec``: ``warmup`` and ``seconds`` (floats). Counting starts at ``start_at`` (monotonic;
    default: now + warmup) so several generator processes count the same window; ``made``:
    clients already set up (``make_clients``), so the setup never eats the window. With
    ``spec["cpu"]`` set, the CPU seconds spent within the counted window are read from ``/proc``
    (``bench.cpu.PARTS``; ``cpu_pids``: the server processes). Returns ``{"cycles", "seconds",
    "lat_ms": [...], "errors", "first_error", "cpu": {part: seconds} or None}``.
    """
    if made is None:
        made = await make_clients(spec, client_ids)
    loop = asyncio.get_running_loop()
    begin = start_at if start_at is not None else loop.time() + spec.get("warmup", 1.0)
    end = begin + spec["seconds"]
    lat: list[float] = []
    counts = [0]
    errors = [0]
    first_error: list[str] = []

    async def client(cycle: Cycle) -> None:
        clock = time.monotonic
        while True:
            t0 = clock()
            if t0 >= end:
                return
            try:
                await cycle()
            except Exception as exc:  # counted and reported; the loop goes on
                errors[0] += 1
                if not first_error:
                    first_error.append(f"{type(exc).__name__}: {exc}"[:300])
                await asyncio.sleep(0.01)
                continue
            t1 = clock()
            if begin <= t0 and t1 <= end:
                counts[0] += 1
                lat.append((t1 - t0) * 1000)

    async def window_cpu() -> dict[str, float]:
        pids = spec.get("cpu_pids", [])
        await asyncio.sleep(max(0.0, begin - loop.time()))
        before = cpu.snapshot(pids)
        await asyncio.sleep(max(0.0, end - loop.time()))
        return cpu.delta(before, cpu.snapshot(pids))

    sampled = asyncio.ensure_future(window_cpu()) if spec.get("cpu") else None
    await asyncio.gather(*(client(c) for c, _ in made))
    await asyncio.gather(*(close() for _, close in made), return_exceptions=True)
    return {"cycles": counts[0], "seconds": spec["seconds"], "lat_ms": lat,
            "errors": errors[0], "first_error": first_error[0] if first_error else None,
            "cpu": await sampled if sampled else None}


from bench.primitives import WORKLOADS as _PRIM_WORKLOADS  # noqa: E402 - section 9

WORKLOADS.update(_PRIM_WORKLOADS)


def _job(kind: str) -> Callable[[dict], Awaitable[dict]]:
    """The job named ``kind``: ``bench.jobs`` (imported here: it imports this module) or
    section 9's ``bench.primitives``."""
    from bench.jobs import JOBS
    from bench.primitives import JOBS as primitive_jobs

    return {**JOBS, **primitive_jobs}[kind]


# --- processes ----------------------------------------------------------------------------------


def _run_loop(coro_fn, *args):
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop ships with uvicorn[standard]
        return asyncio.run(coro_fn(*args))
    return uvloop.run(coro_fn(*args))


# Modules a workload's setup imports, loaded before its process reports ready: the setup runs
# after the common start, within the warm-up, and importing ``lockd`` there can take longer than
# a short warm-up on a loaded machine (no cycle would fall in the counted window).
_PRELOAD = {"fenced_tx": ("lockd", "lockd.tokens")}


def _closed_entry(spec: dict, ids: list[int], ready, go, start_at, out) -> None:
    for module in _PRELOAD.get(spec["workload"], ()):
        importlib.import_module(module)

    async def main() -> dict:
        # connect first, then wait for every process to be connected
        made = await make_clients(spec, ids)
        ready.put(os.getpid())
        await asyncio.get_running_loop().run_in_executor(None, go.wait)
        mono_start = start_at.value
        loop_start = asyncio.get_running_loop().time() + (mono_start - time.monotonic())
        return await closed_loop(spec, ids, loop_start, made=made)

    try:
        out.put(_run_loop(main))
    except BaseException as exc:  # report, do not hang the parent
        out.put({"fatal": f"{type(exc).__name__}: {exc}"})


def _job_entry(kind: str, spec: dict, out) -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        out.put(_run_loop(_job(kind), spec))
    except BaseException as exc:
        out.put({"fatal": f"{type(exc).__name__}: {exc}"})


_ctx = multiprocessing.get_context("spawn")


def _get(queue, procs: list, timeout: float):
    """``queue.get`` that fails fast when a generator process died without answering."""
    import queue as queue_mod

    deadline = time.monotonic() + timeout
    while True:
        try:
            return queue.get(timeout=0.5)
        except queue_mod.Empty:
            if time.monotonic() > deadline:
                raise TimeoutError("load generator did not answer in time") from None
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"load generator exited with {dead[0].exitcode}") from None


def run_closed(spec: dict, clients: int, procs: int = 1) -> dict:
    """The closed loop with ``clients`` over ``procs`` generator processes; merged result."""
    procs = max(1, min(procs, clients))
    ready, out, go = _ctx.Queue(), _ctx.Queue(), _ctx.Event()
    start_at = _ctx.Value("d", 0.0)
    ids = [list(range(clients))[p::procs] for p in range(procs)]
    workers = [_ctx.Process(target=_closed_entry, args=(spec, ids[p], ready, go, start_at, out),
                            daemon=True) for p in range(procs)]
    for w in workers:
        w.start()
    for _ in workers:
        _get(ready, workers, 60)
    start_at.value = time.monotonic() + spec.get("warmup", 1.0) + 0.1
    go.set()
    timeout = spec.get("warmup", 1.0) + spec["seconds"] + 120
    parts = [_get(out, workers, timeout) for _ in workers]
    for w in workers:
        w.join(10)
    fatal = [p["fatal"] for p in parts if "fatal" in p]
    if fatal:
        raise RuntimeError(f"load generator failed: {fatal[0]}")
    lat = [x for p in parts for x in p["lat_ms"]]
    errs = [p["first_error"] for p in parts if p["first_error"]]
    cpu = parts[0].get("cpu")
    if cpu:  # the machine, servers and PostgreSQL once (one window); every generator's own
        cpu = {**cpu, "generator": sum(p["cpu"]["generator"] for p in parts)}
    return {"cycles": sum(p["cycles"] for p in parts), "seconds": spec["seconds"],
            "lat_ms": lat, "errors": sum(p["errors"] for p in parts),
            "first_error": errs[0] if errs else None, "procs": procs, "cpu": cpu}


def start_job(kind: str, spec: dict):
    """Start job ``kind`` in its own process; returns (process, result queue)."""
    out = _ctx.Queue()
    proc = _ctx.Process(target=_job_entry, args=(kind, spec, out), daemon=True)
    proc.start()
    return proc, out


def run(kind: str, spec: dict, timeout: float = 600) -> dict:
    """Run job ``kind`` in its own generator process and return its result."""
    proc, out = start_job(kind, spec)
    try:
        result = _get(out, [proc], timeout)
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    if "fatal" in result:
        raise RuntimeError(f"{kind} failed: {result['fatal']}")
    return result


def manager():
    """A ``spawn`` manager for queues/events that jobs share with the parent."""
    return _ctx.Manager()

