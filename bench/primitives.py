"""Section 9 of ``make bench``: shared locks, semaphores and elections, each as a ratio to a
baseline measured side by side in the same run.

Cycles (closed loop, ``bench.loadgen``; per store and client count, rounds rotated):

- exclusive lock, each client its OWN lock (the baseline: section 1's lockd cycle);
- shared lock, every client on ONE lock (readers never wait for each other);
- shared lock, each client its own lock (the mode's own cost, no sharing);
- exclusive lock, every client on ONE lock (``wait_ms`` 10 s: cycles are serialized through the
  lock's wait queue, so this is the handoff rate, not a request rate);
- semaphore permit, every client on ONE semaphore of ``limit`` = clients (never full).

A cycle is 2 HTTP requests (acquire + release) in every row.

Election handover (``candidate`` jobs, one process each, ``pool`` of them campaigning on one
election; every leader renews its lease every TTL/3): the leader is killed with SIGKILL a random
0..TTL/3 after its first write (or, graceful, resigns); the time runs from the kill
(the resign request being sent) to the next leader's first fenced write through the proxy
answering 200 (``PUT /v1/tables/bench_leader/rows/{row}`` with the leader's token). The baseline is
etcd's election API through its JSON gateway (``/v3/election/campaign`` and ``/resign``, a lease of
the same TTL kept alive with ``/v3/lease/keepalive``): its leader's token is signed by the bench
with the leader key's creation revision as the fence (etcd's own fencing number) and written
through the same proxy. "after lease end": from the end of the killed leader's lease (its last
renewal sent + TTL) to that write.

Environment: ``BENCH_PRIMITIVE_CLIENTS`` (``8,32``), ``BENCH_PRIMITIVE_STORES``
(``sqlite,postgres``; add ``etcd`` for lockd on etcd), ``BENCH_HANDOVERS`` (50 per variant and
peer), ``BENCH_ELECTION_TTL_MS`` (1000; etcd leases are whole seconds, at least 1).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from bench.report import Section, median, pct, ratio

__all__ = ["WORKLOADS", "JOBS", "primitives"]

_STORES = {"sqlite": "lockd · SQLite", "postgres": "lockd · PostgreSQL", "etcd": "lockd · etcd"}
_BASE = "exclusive, own lock each (baseline)"
_TABLE = "bench_leader"
_POLICY = f"tables: {{{_TABLE}: 'bench9e/{{key}}'}}\n"


# --- cycles (run in the generator processes) ------------------------------------------------------


async def _lockd_prim(spec: dict, i: int) -> tuple[Callable[[], Awaitable[None]],
                                                   Callable[[], Awaitable[None]]]:
    """Acquire + release of a lock (``mode``) or a semaphore permit (``limit``), or campaign +
    resign of an election (``kind`` ``election``); ``one_name``:
    every client on the same lock/semaphore, else client ``i`` its own."""
    from bench.loadgen import Http, HttpError

    http = await Http(spec["host"], spec["port"]).connect()
    base = spec["prefix"] if spec.get("one_name") else f"{spec['prefix']}/c{i}"
    body: dict[str, Any] = {"ttl_ms": 30_000, "owner": f"c{i}", "wait_ms": spec.get("wait_ms", 0)}
    take, free = "acquire", "release"
    if spec["kind"] == "sem":
        path, body["limit"] = f"/v1/semaphores/{base}", spec["limit"]
    elif spec["kind"] == "election":
        path, take, free = f"/v1/elections/{base}", "campaign", "resign"
    else:
        path, body["mode"] = f"/v1/locks/{base}", spec["mode"]
    acquire = json.dumps(body).encode()

    async def cycle() -> None:
        status, data = await http.request("POST", f"{path}/{take}", acquire)
        if status != 200:
            raise HttpError(status, data)
        lease_id = json.loads(data)["lease_id"]
        status, data = await http.request("POST", f"{path}/{free}",
                                          b'{"lease_id":"' + lease_id.encode() + b'"}')
        if status != 200:
            raise HttpError(status, data)

    return cycle, http.close


WORKLOADS = {"lockd_prim": _lockd_prim}


# --- an election candidate (one process each) -------------------------------------------------------


async def _again(conn: Any, method: str, path: str, body: bytes, headers: str = "") -> int:
    """``conn.request`` retried once on a fresh connection if the server had closed this one
    (lockd and the proxy close a keep-alive connection idle for 10 s: a candidate can wait
    longer than that before it leads). Returns the status."""
    from bench.loadgen import HttpError

    try:
        return (await conn.request(method, path, body, headers))[0]
    except HttpError as exc:
        if exc.status != 0:
            raise
        return (await conn.request(method, path, body, headers))[0]



async def candidate(spec: dict) -> dict:
    """Campaign until leading, write once through the proxy, then renew until killed or told to
    resign (``spec["resign"]``, an Event). Reports to ``spec["out"]`` (monotonic times): ``waiting``
    (campaign sent), ``leader`` (granted, written, fence, status), ``renewed`` (sent), ``resigned``."""
    from bench.loadgen import Http, _b64

    peer, out, pid = spec["peer"], spec["out"], os.getpid()
    loop = asyncio.get_running_loop()
    http = await Http(spec["host"], spec["port"]).connect()
    keeper = await Http(spec["host"], spec["port"]).connect()
    proxy = await Http(spec["proxy_host"], spec["proxy_port"]).connect()
    name, ttl_ms = spec["name"], spec["ttl_ms"]
    period = ttl_ms / 3000
    lease: dict[str, Any] = {}
    if peer == "etcd":
        from lockd.tokens import KeyRing

        ring = KeyRing.load_or_create(spec["key_dir"])
        grant = await http.json("POST", "/v3/lease/grant", {"TTL": max(1, ttl_ms // 1000)})
        etcd_lease = grant["ID"]

        async def keep_alive() -> None:  # the candidate's key must outlive its wait
            while True:
                sent = time.monotonic()
                await keeper.json("POST", "/v3/lease/keepalive", {"ID": etcd_lease})
                out.put({"event": "renewed", "pid": pid, "t": sent})
                await asyncio.sleep(period)

        keeping = asyncio.ensure_future(keep_alive())
    out.put({"event": "waiting", "pid": pid, "t": time.monotonic()})
    if peer == "etcd":
        doc = await http.json("POST", "/v3/election/campaign",
                              {"name": _b64(name), "lease": etcd_lease, "value": _b64(str(pid))})
        granted = time.monotonic()
        lease.update(doc["leader"])
        fence = int(lease["rev"])
        token = ring.sign(name, fence)
    else:
        while True:
            status, data = await http.request("POST", f"/v1/elections/{name}/campaign", json.dumps(
                {"ttl_ms": ttl_ms, "wait_ms": 60_000, "owner": f"p{pid}"}).encode())
            if status == 200:
                break
            out.put({"event": "refused", "pid": pid, "status": status, "body": data[:200]})
        granted = time.monotonic()
        lease.update(json.loads(data))
        fence, token = lease["fence"], lease["token"]
    status = await _again(proxy, "PUT", f"/v1/tables/{_TABLE}/rows/{spec['row']}",
                          b'{"v":%d}' % fence, f"Fencing-Token: {token}\r\n")
    written = time.monotonic()
    out.put({"event": "leader", "pid": pid, "granted": granted, "written": written,
             "fence": fence, "status": status})
    renew = json.dumps({"lease_id": lease.get("lease_id")}).encode()
    while not await loop.run_in_executor(None, spec["resign"].wait, period):
        if peer != "etcd":
            sent = time.monotonic()
            await _again(keeper, "POST", f"/v1/elections/{name}/renew", renew)
            out.put({"event": "renewed", "pid": pid, "t": sent})
    t = time.monotonic()
    if peer == "etcd":
        keeping.cancel()
        await http.json("POST", "/v3/election/resign", {"leader": lease})
    else:
        await _again(http, "POST", f"/v1/elections/{name}/resign", renew)
    out.put({"event": "resigned", "pid": pid, "t": t})
    return {}


JOBS = {"candidate": candidate}


# --- the section ------------------------------------------------------------------------------------


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.replace(" ", "").split(",") if x)


def _cycles(bench: Any, stores: list[str], clients: tuple[int, ...]) -> tuple[list, dict]:
    from bench import loadgen

    s = bench.settings
    cases: dict[str, dict[str, Any]] = {
        _BASE: {"kind": "lock", "mode": "exclusive"},
        "shared, one lock for all": {"kind": "lock", "mode": "shared", "one_name": True},
        "shared, own lock each": {"kind": "lock", "mode": "shared"},
        "exclusive, one lock for all (queued)": {"kind": "lock", "mode": "exclusive",
                                                 "one_name": True, "wait_ms": 10_000},
        "semaphore, one for all, limit = clients": {"kind": "sem", "one_name": True},
    }
    res: dict[tuple[str, str, int], list[dict]] = {}
    names = list(cases)
    for r in range(s.rounds):
        for store in stores:
            server = bench.server(f"lockd-{store}")
            for c in clients:
                for case in names[r % len(names):] + names[:r % len(names)]:
                    spec = {**cases[case], **server.addr(), "workload": "lockd_prim",
                            "prefix": f"bench9/{r}/{c}/{names.index(case)}", "limit": c,
                            "warmup": s.warmup, "seconds": s.seconds}
                    out = loadgen.run_closed(spec, c, s.procs)
                    res.setdefault((store, case, c), []).append(out)
    rows, data = [], {}
    for store in stores:
        for c in clients:
            base_runs = res[(store, _BASE, c)]
            base = median([x["cycles"] / x["seconds"] for x in base_runs])
            base_p99 = pct([v for x in base_runs for v in x["lat_ms"]], 99)
            for case in names:
                runs = res[(store, case, c)]
                rate = median([x["cycles"] / x["seconds"] for x in runs])
                lat = [v for x in runs for v in x["lat_ms"]]
                errors = sum(x["errors"] for x in runs)
                rows.append([f"{_STORES[store]}: {case}", c, rate, pct(lat, 50), pct(lat, 99),
                             ratio(rate, base), ratio(pct(lat, 99), base_p99), errors])
                data[f"{_STORES[store]}: {case} @{c}"] = {
                    "rates": [x["cycles"] / x["seconds"] for x in runs], "errors": errors,
                    "first_error": next((x["first_error"] for x in runs if x["first_error"]),
                                        None)}
    return rows, data


class Events:
    """The candidates' reports as the driver reads them: ``waiting`` and ``renewed`` (pid →
    monotonic time) kept current, ``leader``/``resigned`` reports kept in order until asked for
    (a resigned leader's successor can report before the resigned one does). ``describe`` says
    who is alive when :meth:`next` times out; ``grant_renews``: a leader's lease runs from its
    grant (lockd), not from its last keep-alive (etcd)."""

    def __init__(self, queue: Any, describe: Callable[[], str], grant_renews: bool):
        self.queue, self.describe, self.grant_renews = queue, describe, grant_renews
        self.waiting: dict[int, float] = {}
        self.renewed: dict[int, float] = {}
        self.pending: list[dict] = []
        self.seen: list[dict] = []  # every report but renewals, for the error message

    def absorb(self, doc: dict) -> None:
        kind = doc["event"]
        if kind == "renewed":
            self.renewed[doc["pid"]] = doc["t"]
            return
        self.seen = self.seen[-11:] + [doc]
        if kind == "waiting":
            self.waiting[doc["pid"]] = doc["t"]
        elif kind in ("leader", "resigned"):
            self.pending.append(doc)
        if kind == "leader" and self.grant_renews:
            self.renewed.setdefault(doc["pid"], doc["granted"])

    def poll(self, timeout: float) -> bool:
        """Absorb one report within ``timeout`` s; False if none came."""
        try:
            self.absorb(self.queue.get(timeout=timeout))
        except Exception:  # queue.Empty, also through a manager's proxy
            return False
        return True

    def next(self, kind: str, timeout: float = 60) -> dict:
        """The oldest ``kind`` report not yet taken, waiting up to ``timeout`` s for it.
        Raises RuntimeError naming the live candidates and the last reports if none comes."""
        deadline = time.monotonic() + timeout
        while True:
            for i, doc in enumerate(self.pending):
                if doc["event"] == kind:
                    return self.pending.pop(i)
            if not self.poll(max(0.1, deadline - time.monotonic())):
                raise RuntimeError(f"no {kind!r} report in {timeout} s: {self.describe()}; "
                                   f"last reports: {self.seen}")


def handovers(bench: Any, peer: str, server: Any, proxy: Any, row: int, graceful: bool,
              count: int, ttl_ms: int, key_dir: str, pool: int = 4) -> dict[str, Any]:
    """``count`` handovers of one election among ``pool`` candidate processes; per handover the
    ms from the kill (resign) to the next leader's fenced write, its grant, and the lease end."""
    from bench import loadgen

    mgr = loadgen.manager()
    out = mgr.Queue()
    procs: dict[int, tuple[Any, Any, Any]] = {}
    spec = {"peer": peer, **server.addr(), "proxy_host": proxy.host, "proxy_port": proxy.port,
            "name": f"bench9e/{row}", "row": row, "ttl_ms": ttl_ms, "key_dir": key_dir,
            "out": out}

    def spawn() -> None:
        ev = mgr.Event()
        proc, result = loadgen.start_job("candidate", {**spec, "resign": ev})
        procs[proc.pid] = (proc, ev, result)  # the result queue must outlive the start

    def dead() -> str:
        exited = {pid: p.exitcode for pid, (p, *_) in procs.items() if not p.is_alive()}
        return (f"{peer} handover {len(result['write_ms'])} (graceful={graceful}); exited: "
                f"{exited}; alive: {sorted(procs)}")

    events = Events(out, dead, grant_renews=peer != "etcd")
    waiting, renewed, next_event = events.waiting, events.renewed, events.next
    result: dict[str, list[float]] = {"write_ms": [], "grant_ms": [], "after_end_ms": [],
                                      "bad_status": []}
    try:
        spawn()
        leader = next_event("leader")
        for _ in range(pool - 1):
            spawn()
        for _ in range(count):
            # at least one other candidate queued for 0.2 s before the leader goes
            while not any(p != leader["pid"] and time.monotonic() - t > 0.2
                          for p, t in waiting.items()):
                events.poll(0.2)
            old = leader["pid"]
            proc, ev, _ = procs.pop(old)
            waiting.pop(old, None)
            if graceful:
                ev.set()
                t_end = next_event("resigned")["t"]
            else:  # at a random phase of its renewals, as a crash would come
                time.sleep(random.uniform(0, ttl_ms / 3000))
                t_end = time.monotonic()
                os.kill(old, signal.SIGKILL)
            leader = next_event("leader")
            waiting.pop(leader["pid"], None)
            result["write_ms"].append((leader["written"] - t_end) * 1000)
            result["grant_ms"].append((leader["granted"] - t_end) * 1000)
            if not graceful and old in renewed:
                lease_end = renewed[old] + ttl_ms / 1000
                result["after_end_ms"].append((leader["written"] - lease_end) * 1000)
            if leader["status"] != 200:
                result["bad_status"].append(leader["status"])
            proc.join(10)
            spawn()
    finally:
        for proc, *_ in procs.values():
            proc.kill()
        for proc, *_ in procs.values():
            proc.join(10)
        mgr.shutdown()
    return result


def _elections(bench: Any, stores: list[str]) -> tuple[list, dict, int, int]:
    import httpx

    from lockd.tokens import KeyRing

    count = int(os.environ.get("BENCH_HANDOVERS", 50))
    ttl_ms = int(os.environ.get("BENCH_ELECTION_TTL_MS", 1000))
    key_dir = str(bench.ws.dir / "bench9-etcd-keys")
    ring = KeyRing.load_or_create(key_dir)
    peers: dict[str, tuple[str, Any]] = {}
    if bench.has("etcd"):
        peers["etcd election API (baseline)"] = ("etcd", bench.server("etcd"))
    for store in stores:
        peers[_STORES[store]] = ("lockd", bench.server(f"lockd-{store}"))
    jwks = {"keys": list(ring.jwks()["keys"])}
    lockd_any = next((srv for p, srv in peers.values() if p == "lockd"), None)
    if lockd_any is not None:
        jwks["keys"] += httpx.get(f"http://{lockd_any.host}:{lockd_any.port}/v1/keys").json()["keys"]
    dsn = bench.ws.database()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {_TABLE} (id bigint PRIMARY KEY, v bigint NOT NULL)")
    proxy = bench.ws.proxy(dsn, jwks, _POLICY, name="proxy-elections")
    rows, data = [], {}
    base: dict[bool, list[float]] = {}
    for graceful in (False, True):
        for n, (label, (peer, server)) in enumerate(peers.items()):
            r = handovers(bench, peer, server, proxy, 10 * n + graceful, graceful, count, ttl_ms,
                          key_dir)
            w = r["write_ms"]
            if "baseline" in label:
                base[graceful] = w
            b = base.get(graceful, [])
            how = "resign" if graceful else "kill -9"
            rows.append([f"{label}: {how}", len(w), None, pct(w, 50), pct(w, 99),
                         ratio(pct(w, 50), pct(b, 50)), ratio(pct(w, 99), pct(b, 99)),
                         len(r["bad_status"])])
            data[f"{label}: {how}"] = {**r, "p50_ms": pct(w, 50), "p99_ms": pct(w, 99),
                                       "grant_p50_ms": pct(r["grant_ms"], 50),
                                       "after_lease_end_p50_ms": pct(r["after_end_ms"], 50)}
    return rows, data, count, ttl_ms


def primitives(bench: Any) -> Section:
    """Section 9: shared-lock and semaphore cycles ÷ exclusive cycles; election handover."""
    stores = [x for x in os.environ.get("BENCH_PRIMITIVE_STORES", "sqlite,postgres").split(",")
              if x.strip() and bench.has("postgres" if x == "postgres" else
                                         "etcd" if x == "etcd" else "")]
    clients = _ints(os.environ.get("BENCH_PRIMITIVE_CLIENTS", "8,32"))
    rows, data = _cycles(bench, stores, clients)
    erows, edata, count, ttl_ms = _elections(bench, stores)
    section = Section(
        "9", "New primitives: shared locks, semaphores, election handover",
        "cycles: exclusive lock cycles, each client its own lock, same store and clients; "
        "handover: etcd's election API (JSON gateway), same TTL, same proxy write",
        [("row", "str"), ("clients / n", "int"), ("cycles/s", "int"), ("p50 ms", "ms"),
         ("p99 ms", "ms"), ("× baseline", "x"), ("p99 × baseline", "x"), ("errors", "int")])
    section.rows = rows + erows
    section.data = {**data, **edata}
    section.notes.append(
        "Cycle rows: '× baseline' is cycles/s ÷ the same store's exclusive own-lock cycles/s at "
        "the same clients. 'one lock for all' = every client on the same name; 'queued' = the "
        "exclusive acquires wait (wait_ms 10 s), so its rate is the lock's handoff rate.")
    section.notes.append(
        f"Handover rows ({count} per row, TTL {ttl_ms} ms, 4 candidate processes): p50/p99 ms "
        "from the SIGKILL (or the resign request) to the next leader's first fenced write "
        "through the proxy answering 200; '× baseline' is p50 ÷ etcd's p50 (< 1: faster than "
        "etcd); 'errors' counts writes that did not answer 200. Grant p50 / p50 after the "
        "killed lease's end: " + "; ".join(
            f"{k} {_ms(v['grant_p50_ms'])} / {_ms(v['after_lease_end_p50_ms'])}"
            for k, v in edata.items()) + ".")
    return section


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f} ms"
