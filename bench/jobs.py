"""The scenario jobs besides the closed loop, each run in its own generator process by
``bench.loadgen.run(kind, spec)``: ``handoff``, ``hold_and_freeze``, ``takeover_wait``,
``renewals``, ``fill``, ``probe`` and ``queue_load`` (``JOBS``). Each takes the job's ``spec``
and returns a JSON-able result; the HTTP client and the workloads' helpers are
``bench.loadgen``'s.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from bench.loadgen import Http, HttpError, _b64

__all__ = ["JOBS"]
async def handoff(spec: dict) -> dict:
    """``clients`` waiters contend for ONE lock for ``seconds``; each holds it ``hold_ms``.

    Handoff = from the moment a holder sends its release (unlock) until the next holder's grant
    arrives. ``peer``: ``lockd`` (acquire with ``wait_ms``), ``etcd`` (``/v3/lock/lock`` blocks)
    or ``redis`` (redis-py ``Lock.acquire`` polling every ``sleep`` s). Returns
    ``{"handoffs_ms": [...], "grants", "errors"}``.
    """
    peer = spec["peer"]
    loop = asyncio.get_running_loop()
    end = loop.time() + spec["warmup"] + spec["seconds"]
    begin = loop.time() + spec["warmup"]
    released_at: list[float | None] = [None]
    handoffs: list[float] = []
    grants = [0]
    errors: list[str] = []
    hold = spec.get("hold_ms", 1) / 1000
    name = spec["name"]

    def granted() -> None:
        now = time.monotonic()
        if released_at[0] is not None and now >= begin:
            handoffs.append((now - released_at[0]) * 1000)
            grants[0] += 1
        released_at[0] = None

    async def lockd_client(i: int) -> None:
        http = await Http(spec["host"], spec["port"]).connect()
        body = json.dumps({"ttl_ms": 10_000, "wait_ms": 60_000, "owner": f"w{i}"}).encode()
        try:
            while loop.time() < end:
                status, data = await http.request("POST", f"/v1/locks/{name}/acquire", body)
                if status != 200:
                    errors.append(f"acquire {status}")
                    continue
                granted()
                lease_id = json.loads(data)["lease_id"]
                await asyncio.sleep(hold)
                released_at[0] = time.monotonic()
                await http.json("POST", f"/v1/locks/{name}/release", {"lease_id": lease_id})
        finally:
            await http.close()

    async def etcd_client(i: int) -> None:
        http = await Http(spec["host"], spec["port"]).connect()
        key_name = _b64(name)
        try:
            while loop.time() < end:
                lease = (await http.json("POST", "/v3/lease/grant", {"TTL": 30}))["ID"]
                key = (await http.json("POST", "/v3/lock/lock",
                                       {"name": key_name, "lease": lease}))["key"]
                granted()
                await asyncio.sleep(hold)
                released_at[0] = time.monotonic()
                await http.json("POST", "/v3/lock/unlock", {"key": key})
                await http.json("POST", "/v3/lease/revoke", {"ID": lease})
        finally:
            await http.close()

    async def redis_client(i: int) -> None:
        import redis.asyncio as aioredis

        client = aioredis.Redis(single_connection_client=True)
        lock = client.lock(name, timeout=10, sleep=spec.get("sleep", 0.1))
        try:
            while loop.time() < end:
                if not await lock.acquire(blocking=True, blocking_timeout=60):
                    errors.append("redis acquire timed out")
                    continue
                granted()
                await asyncio.sleep(hold)
                released_at[0] = time.monotonic()
                await lock.release()
        finally:
            await client.aclose()

    run_client = {"lockd": lockd_client, "etcd": etcd_client, "redis": redis_client}[peer]
    results = await asyncio.gather(*(run_client(i) for i in range(spec["clients"])),
                                   return_exceptions=True)
    errs = errors + [f"{type(r).__name__}: {r}" for r in results if isinstance(r, BaseException)]
    return {"handoffs_ms": handoffs, "grants": grants[0], "seconds": spec["seconds"],
            "errors": len(errs), "first_error": errs[0][:300] if errs else None}


async def hold_and_freeze(spec: dict) -> dict:
    """The crash-takeover holder: acquire, report, then wait to be killed (never release or
    renew). Reports the monotonic time the grant arrived and the TTL the store granted."""
    peer = spec["peer"]
    http = await Http(spec["host"], spec["port"]).connect() if peer != "redis" else None
    name = spec["name"]
    if peer == "lockd":
        sent = time.monotonic()
        lease = await http.json("POST", f"/v1/locks/{name}/acquire",
                                {"ttl_ms": spec["ttl_ms"], "owner": "doomed"})
        got, ttl_ms = time.monotonic(), lease["ttl_ms"]
    elif peer == "etcd":
        sent = time.monotonic()
        lease = await http.json("POST", "/v3/lease/grant", {"TTL": spec["ttl_ms"] // 1000})
        got, ttl_ms = time.monotonic(), int(lease["TTL"]) * 1000  # the lease runs from here
        await http.json("POST", "/v3/lock/lock", {"name": _b64(name), "lease": lease["ID"]})
    else:
        import redis.asyncio as aioredis

        client = aioredis.Redis(single_connection_client=True)
        lock = client.lock(name, timeout=spec["ttl_ms"] / 1000)
        sent = time.monotonic()
        assert await lock.acquire(blocking=False)
        got, ttl_ms = time.monotonic(), spec["ttl_ms"]
    spec["report"].put({"sent": sent, "granted": got, "ttl_ms": ttl_ms})
    await asyncio.sleep(3600)  # killed with SIGKILL long before this
    return {}


async def takeover_wait(spec: dict) -> dict:
    """The crash-takeover waiter: connect, signal ``ready``, wait for ``go`` (the doomed holder
    has the lock), then block on the lock and return the monotonic time of the grant."""
    peer = spec["peer"]
    name = spec["name"]
    loop = asyncio.get_running_loop()
    if peer == "redis":
        import redis.asyncio as aioredis

        client = aioredis.Redis(single_connection_client=True)
        await client.ping()
    else:
        http = await Http(spec["host"], spec["port"]).connect()
    spec["ready"].set()
    await loop.run_in_executor(None, spec["go"].wait, 60)
    if peer == "lockd":
        lease = await http.json("POST", f"/v1/locks/{name}/acquire",
                                {"ttl_ms": 10_000, "wait_ms": 30_000, "owner": "heir"})
        got = time.monotonic()
        await http.json("POST", f"/v1/locks/{name}/release", {"lease_id": lease["lease_id"]})
    elif peer == "etcd":
        lease = await http.json("POST", "/v3/lease/grant", {"TTL": 10})
        key = (await http.json("POST", "/v3/lock/lock",
                               {"name": _b64(name), "lease": lease["ID"]}))["key"]
        got = time.monotonic()
        await http.json("POST", "/v3/lock/unlock", {"key": key})
        await http.json("POST", "/v3/lease/revoke", {"ID": lease["ID"]})
    else:
        lock = client.lock(name, timeout=10, sleep=spec.get("sleep", 0.1))
        assert await lock.acquire(blocking=True, blocking_timeout=30)
        got = time.monotonic()
        await lock.release()
        await client.aclose()
    return {"granted": got}


async def renewals(spec: dict) -> dict:
    """Hold ``leases`` leases and renew each every ``period_ms`` for ``seconds``.

    Open loop: renewals are due on a fixed schedule (phases spread evenly) and go out over a
    pool of ``connections`` keep-alive connections; a renewal's latency runs from when it was
    DUE to its answer, so queueing anywhere (server or generator) counts. ``peer``: ``lockd``
    (acquire ``leases`` locks, then ``/renew``), ``lockd-each`` (the same leases held by
    clients of ``batch`` leases each, default 1000, every client renewing all of its leases
    in one ``POST /v1/leases/renew-each`` per tick, as the Python client does) or ``etcd``
    (grant etcd leases, then ``/v3/lease/keepalive``). Returns latencies (one per lease
    renewed), misses (not live any more) and errors.
    """
    peer = spec["peer"]
    n, period = spec["leases"], spec["period_ms"] / 1000
    conns = [await Http(spec["host"], spec["port"]).connect()
             for _ in range(spec.get("connections", 64))]
    pool: asyncio.Queue[Http] = asyncio.Queue()
    for c in conns:
        pool.put_nowait(c)
    prefix = spec["prefix"]
    ttl_ms = spec["ttl_ms"]

    async def with_conn(fn):
        c = await pool.get()
        try:
            return await fn(c)
        finally:
            pool.put_nowait(c)

    # set up: acquire/grant n leases, 64 at a time
    held: list[Any] = [None] * n

    async def setup(i: int) -> None:
        if peer.startswith("lockd"):
            doc = await with_conn(lambda c: c.json("POST", f"/v1/locks/{prefix}/{i}/acquire",
                                                   {"ttl_ms": ttl_ms}))
            held[i] = doc["lease_id"]
        else:
            doc = await with_conn(lambda c: c.json("POST", "/v3/lease/grant",
                                                   {"TTL": ttl_ms // 1000}))
            held[i] = doc["ID"]

    t_setup = time.monotonic()
    for lo in range(0, n, 512):
        await asyncio.gather(*(setup(i) for i in range(lo, min(n, lo + 512))))
    setup_s = time.monotonic() - t_setup

    lat: list[float] = []
    misses = [0]
    errors: list[str] = []
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.2
    end = start + spec["seconds"]
    renew_ttl = json.dumps({"ttl_ms": ttl_ms})

    async def renew(i: int, due: float) -> None:
        async def call(c: Http) -> None:
            if peer == "lockd":
                body = f'{{"lease_id":"{held[i]}",{renew_ttl[1:]}'.encode()
                status, data = await c.request("POST", f"/v1/locks/{prefix}/{i}/renew", body)
                if status == 410:
                    misses[0] += 1
                elif status != 200:
                    raise HttpError(status, data)
            else:
                doc = await c.json("POST", "/v3/lease/keepalive", {"ID": held[i]})
                if int(doc.get("result", {}).get("TTL", 0) or 0) <= 0:
                    misses[0] += 1

        try:
            await with_conn(call)
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}"[:200])
            return
        lat.append((loop.time() - due) * 1000)

    batch = spec.get("batch", 1000)
    groups = [range(lo, min(n, lo + batch)) for lo in range(0, n, batch)]
    if peer == "lockd-each":  # keep the connections the ticks use: lockd closes idle ones
        keep = min(len(conns), 2 * len(groups))
        for c in conns[keep:]:
            await c.close()
        del conns[keep:]
        pool = asyncio.Queue()
        for c in conns:
            pool.put_nowait(c)

    async def renew_group(g: int, due: float) -> None:
        items = ",".join(f'{{"lock":"{prefix}/{i}","lease_id":"{held[i]}",{renew_ttl[1:-1]}}}'
                         for i in groups[g])

        async def call(c: Http) -> None:
            status, data = await c.request("POST", "/v1/leases/renew-each",
                                           f'{{"leases":[{items}]}}'.encode())
            if status != 200:
                raise HttpError(status, data)
            misses[0] += sum(1 for r in json.loads(data)["results"] if r["status"] != 200)

        try:
            await with_conn(call)
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}"[:200])
            return
        lat.extend([(loop.time() - due) * 1000] * len(groups[g]))

    async def schedule(i: int) -> None:
        each = peer == "lockd-each"
        due = start + period * i / (len(groups) if each else n)
        tasks = []
        while due < end:
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(renew_group(i, due) if each else renew(i, due)))
            due += period
        await asyncio.gather(*tasks)

    await asyncio.gather(*(schedule(i) for i in range(len(groups) if peer == "lockd-each"
                                                        else n)))
    # clean up: release / revoke everything
    async def cleanup(i: int) -> None:
        try:
            if peer.startswith("lockd"):
                await with_conn(lambda c: c.request(
                    "POST", f"/v1/locks/{prefix}/{i}/release",
                    json.dumps({"lease_id": held[i]}).encode()))
            else:
                await with_conn(lambda c: c.json("POST", "/v3/lease/revoke", {"ID": held[i]}))
        except Exception:  # best effort; the TTL ends it anyway
            pass

    for lo in range(0, n, 512):
        await asyncio.gather(*(cleanup(i) for i in range(lo, min(n, lo + 512))))
    for c in conns:
        await c.close()
    return {"lat_ms": lat, "misses": misses[0], "errors": len(errors),
            "first_error": errors[0] if errors else None, "setup_s": setup_s,
            "expected": int(n * spec["seconds"] / period)}


async def fill(spec: dict) -> dict:
    """Acquire ``count`` locks ``prefix/{start..start+count}`` with a long TTL over
    ``connections`` connections; returns how long it took and the errors."""
    conns = [await Http(spec["host"], spec["port"]).connect()
             for _ in range(spec.get("connections", 32))]
    body = json.dumps({"ttl_ms": spec.get("ttl_ms", 3_600_000)}).encode()
    prefix, start, count = spec["prefix"], spec.get("start", 0), spec["count"]
    errors = [0]
    nxt = [start]

    async def worker(c: Http) -> None:
        while nxt[0] < start + count:
            i = nxt[0]
            nxt[0] += 1
            status, _ = await c.request("POST", f"/v1/locks/{prefix}/{i}/acquire", body)
            if status != 200:
                errors[0] += 1

    t0 = time.monotonic()
    await asyncio.gather(*(worker(c) for c in conns))
    took = time.monotonic() - t0
    for c in conns:
        await c.close()
    return {"seconds": took, "errors": errors[0]}


async def probe(spec: dict) -> dict:
    """One client, ``samples`` times: acquire a fresh lock, then release it. Returns both
    latencies (ms)."""
    http = await Http(spec["host"], spec["port"]).connect()
    acq: list[float] = []
    rel: list[float] = []
    body = json.dumps({"ttl_ms": 30_000}).encode()
    for i in range(spec["samples"]):
        name = f"{spec['prefix']}/{i}"
        t0 = time.monotonic()
        status, data = await http.request("POST", f"/v1/locks/{name}/acquire", body)
        t1 = time.monotonic()
        if status != 200:
            raise HttpError(status, data)
        lease_id = json.loads(data)["lease_id"]
        await http.json("POST", f"/v1/locks/{name}/release", {"lease_id": lease_id})
        rel.append((time.monotonic() - t1) * 1000)
        acq.append((t1 - t0) * 1000)
    await http.close()
    return {"acquire_ms": acq, "release_ms": rel}


async def queue_load(spec: dict) -> dict:
    """``waiters`` acquires queued over ``locks`` locks, then served in turn.

    For each lock a gate lease is taken first; waiter k (k = 0..waiters-1) queues on lock
    k % locks, each on its own connection, and is confirmed queued (``GET`` shows the waiter
    count grow) before the next one is sent, so the arrival order is known. Then the gates are
    released; each waiter holds its grant ``hold_ms`` and releases. Checks that every lock
    served its waiters in arrival order; records the release-to-next-grant handoffs.
    """
    host, port, locks, total = spec["host"], spec["port"], spec["locks"], spec["waiters"]
    prefix = spec["prefix"]
    admin = await Http(host, port).connect()
    gates = []
    for j in range(locks):
        gates.append((await admin.json("POST", f"/v1/locks/{prefix}/{j}/acquire",
                                       {"ttl_ms": 300_000, "owner": "gate"}))["lease_id"])
    order: dict[int, list[int]] = {j: [] for j in range(locks)}
    released_at: dict[int, float] = {}
    handoffs: list[float] = []
    errors: list[str] = []
    hold = spec.get("hold_ms", 2) / 1000
    conns = [Http(host, port) for _ in range(total)]
    for lo in range(0, total, 200):
        await asyncio.gather(*(c.connect() for c in conns[lo:lo + 200]))

    async def waiter(k: int, sent: asyncio.Event) -> None:
        j = k % locks
        c = conns[k]
        body = json.dumps({"ttl_ms": 60_000, "wait_ms": 290_000, "owner": f"w{k}"}).encode()
        task = asyncio.ensure_future(c.request("POST", f"/v1/locks/{prefix}/{j}/acquire", body))
        sent.set()
        try:
            status, data = await task
        except Exception as exc:
            errors.append(f"waiter {k}: {type(exc).__name__}: {exc}"[:200])
            return
        now = time.monotonic()
        if status != 200:
            errors.append(f"waiter {k}: HTTP {status} {data[:100]!r}")
            return
        if j in released_at:
            handoffs.append((now - released_at.pop(j)) * 1000)
        order[j].append(k)
        await asyncio.sleep(hold)
        released_at[j] = time.monotonic()
        status, data = await c.request("POST", f"/v1/locks/{prefix}/{j}/release",
                                       json.dumps({"lease_id": json.loads(data)["lease_id"]})
                                       .encode())
        if status != 200:
            errors.append(f"waiter {k} release: HTTP {status}")

    tasks = []
    t_queue = time.monotonic()
    for k in range(total):
        sent = asyncio.Event()
        tasks.append(asyncio.ensure_future(waiter(k, sent)))
        await sent.wait()
        j = k % locks
        want = k // locks + 1
        for _ in range(2000):  # confirm it is queued before the next one goes
            state = await admin.json("GET", f"/v1/locks/{prefix}/{j}")
            if state["waiters"] >= want:
                break
            await asyncio.sleep(0.001)
        else:
            errors.append(f"waiter {k} never showed up queued")
    queued_s = time.monotonic() - t_queue
    spec["queued"].set()  # the parent samples lockd's memory now
    t_serve = time.monotonic()
    for j, lease_id in enumerate(gates):
        released_at[j] = time.monotonic()
        await admin.json("POST", f"/v1/locks/{prefix}/{j}/release", {"lease_id": lease_id})
    await asyncio.gather(*tasks)
    serve_s = time.monotonic() - t_serve
    fifo = all(order[j] == sorted(order[j]) for j in order)
    served = sum(len(v) for v in order.values())
    for lo in range(0, total, 200):
        await asyncio.gather(*(c.close() for c in conns[lo:lo + 200]))
    await admin.close()
    return {"fifo": fifo, "served": served, "errors": len(errors),
            "first_error": errors[0] if errors else None, "handoffs_ms": handoffs,
            "queue_s": queued_s, "serve_s": serve_s}


JOBS = {
    "handoff": handoff,
    "hold_and_freeze": hold_and_freeze,
    "takeover_wait": takeover_wait,
    "renewals": renewals,
    "fill": fill,
    "probe": probe,
    "queue_load": queue_load,
}
