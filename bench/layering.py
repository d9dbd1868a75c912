"""Can semaphores and elections be layers over the lock store? Native store paths against
recipes over ``LockStore``, side by side in one run.

::

    python -m bench.layering                       # sqlite, postgres, etcd; 1 and 8 clients
    python -m bench.layering --stores sqlite --clients 8 --seconds 2

The recipes are the ones etcd's ``concurrency`` package and kazoo build:

- **permit**: a semaphore of ``limit`` permits as ``limit`` slot locks ``sem/{name}/{slot}``,
  tried in turn from slot 0 (the lowest free slot, as the native path picks it) with
  ``LockStore.acquire``; the permit is the first slot granted, its release the slot's release.
  Native: ``SemaphoreStore.sem_acquire`` + ``sem_release``. Every client on ONE semaphore of
  ``limit`` = clients (never full: the recipe pays for its probing, not for waiting).
- **campaign**: an election as a lock plus a value: ``LockStore.acquire(name)`` then the value
  and its log entry (``elect_proclaim``, the only value write the store has), and to resign the
  value cleared the same way then ``LockStore.release``. Native: ``elect_campaign`` +
  ``elect_resign`` (grant, value and log entry in one store step). Each client its own election.

Closed loop, the store opened in this process (no HTTP, no lockd), ``rounds`` rounds of
``seconds`` per variant alternated native/layered (so a drift in the machine's load hits both).
Printed per store, cycle and client count: cycles/s, this process's CPU per cycle (SQLite's
work runs here; PostgreSQL's and etcd's servers are not counted), store calls per cycle, the
layered/native ratios, and the noise: the spread between the native rounds themselves.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from lockd.server.core.base import new_lease_id
from lockd.server.store import open_store
from lockd.server.store.base import Store
from lockd.server.store.values import EXCLUSIVE, Grant, SemGrant

__all__ = ["LayeredElection", "LayeredSemaphore", "main"]

_TTL_MS = 30_000


class _Counting:
    """Counts the store calls made through it (the cost model: one call, one round trip)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.store, name)
        if not callable(attr):
            return attr

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return await attr(*args, **kwargs)

        return counted


class LayeredSemaphore:
    """A semaphore as ``limit`` slot locks over ``LockStore`` (a permit: the first slot lock
    granted, tried from slot 0). It has no fence counter of its own (a permit's fence is its
    slot lock's) and no record of its limit: both would need a store step of their own."""

    def __init__(self, store: Any) -> None:
        self.store = store

    async def acquire(self, name: str, limit: int, lease_id: str, owner: str) -> str | None:
        """The slot lock granted, or ``None`` when every slot is held."""
        for slot in range(limit):
            lock = f"sem/{name}/{slot}"
            got = await self.store.acquire(lock, lease_id=lease_id, ttl_ms=_TTL_MS, owner=owner,
                                           client_id=None, mode=EXCLUSIVE)
            if isinstance(got, Grant):
                return lock
        return None

    async def release(self, lock: str, lease_id: str) -> None:
        await self.store.release(lock, lease_id)


class LayeredElection:
    """An election as a lock plus a value over ``LockStore``: the grant, then the value and its
    log entry as a second step (not atomic with the grant: a lockd that dies in between leaves a
    leader nobody observed)."""

    def __init__(self, store: Any) -> None:
        self.store = store

    async def campaign(self, name: str, lease_id: str, owner: str, value: str) -> bool:
        got = await self.store.acquire(name, lease_id=lease_id, ttl_ms=_TTL_MS, owner=owner,
                                       client_id=None, mode=EXCLUSIVE)
        if not isinstance(got, Grant):
            return False
        await self.store.elect_proclaim(name, lease_id, value)
        return True

    async def resign(self, name: str, lease_id: str) -> None:
        await self.store.elect_proclaim(name, lease_id, "")
        await self.store.release(name, lease_id)


# --- the cycles ---------------------------------------------------------------------------------

Cycle = Callable[[int], Awaitable[None]]


def permit_cycles(store: Any, run: str, clients: int) -> dict[str, Cycle]:
    name, layered = f"{run}/sem", LayeredSemaphore(store)

    async def native(i: int) -> None:
        lease_id = new_lease_id()
        while not isinstance(await store.sem_acquire(
                name, limit=clients, lease_id=lease_id, ttl_ms=_TTL_MS, owner=f"c{i}",
                client_id=None), SemGrant):
            await asyncio.sleep(0)
        await store.sem_release(name, lease_id)

    async def recipe(i: int) -> None:
        lease_id = new_lease_id()
        while (lock := await layered.acquire(f"{name}-l", clients, lease_id, f"c{i}")) is None:
            await asyncio.sleep(0)
        await layered.release(lock, lease_id)

    return {"native": native, "layered": recipe}


def campaign_cycles(store: Any, run: str, clients: int) -> dict[str, Cycle]:
    layered = LayeredElection(store)

    async def native(i: int) -> None:
        lease_id, name = new_lease_id(), f"{run}/e{i}"
        got = await store.elect_campaign(name, lease_id=lease_id, ttl_ms=_TTL_MS, owner=f"c{i}",
                                         client_id=None, value="v")
        assert isinstance(got, Grant), got
        await store.elect_resign(name, lease_id)

    async def recipe(i: int) -> None:
        lease_id, name = new_lease_id(), f"{run}/le{i}"
        assert await layered.campaign(name, lease_id, f"c{i}", "v")
        await layered.resign(name, lease_id)

    return {"native": native, "layered": recipe}


@dataclass
class _Tally:
    cycles: list[float] = field(default_factory=list)  # cycles/s per round
    cpu: list[float] = field(default_factory=list)  # CPU ms per cycle per round
    calls: list[float] = field(default_factory=list)  # store calls per cycle per round


async def _round(cycle: Cycle, clients: int, seconds: float, counter: _Counting,
                 tally: _Tally) -> None:
    done = 0
    stop = time.monotonic() + seconds

    async def client(i: int) -> None:
        nonlocal done
        while time.monotonic() < stop:
            await cycle(i)
            done += 1

    counter.calls = 0
    cpu0, t0 = time.process_time(), time.monotonic()
    await asyncio.gather(*(client(i) for i in range(clients)))
    cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
    tally.cycles.append(done / wall)
    tally.cpu.append(cpu * 1000 / max(done, 1))
    tally.calls.append(counter.calls / max(done, 1))


async def measure(url: str, clients: int, seconds: float, rounds: int,
                  run: str) -> dict[str, dict[str, _Tally]]:
    """``{cycle: {"native"|"layered": tally}}`` for one store and client count."""
    store = open_store(url, clock=time.time)
    await store.open()
    counter = _Counting(store)
    out: dict[str, dict[str, _Tally]] = {}
    try:
        for what, make in (("permit", permit_cycles), ("campaign", campaign_cycles)):
            cycles = make(counter, f"{run}/{what}/{clients}", clients)
            tallies = out[what] = {variant: _Tally() for variant in cycles}
            for cycle in cycles.values():  # warm up: prepared statements, rows, connections
                await asyncio.gather(*(cycle(i) for i in range(clients)))
            for r in range(rounds):
                order = ("native", "layered") if r % 2 == 0 else ("layered", "native")
                for variant in order:
                    await _round(cycles[variant], clients, seconds, counter, tallies[variant])
    finally:
        await store.close()
    return out


def _report(store: str, clients: int, result: dict[str, dict[str, _Tally]]) -> list[str]:
    lines = []
    for what, tallies in result.items():
        native, layered = tallies["native"], tallies["layered"]
        n_rate, l_rate = statistics.median(native.cycles), statistics.median(layered.cycles)
        n_cpu, l_cpu = statistics.median(native.cpu), statistics.median(layered.cpu)
        noise = (max(native.cycles) / min(native.cycles) - 1) * 100 if min(native.cycles) else 0
        lines.append(
            f"{store:8} {what:8} {clients:>3}  {n_rate:9.0f} {l_rate:9.0f}  {l_rate / n_rate:6.2f}"
            f"  {n_cpu:7.2f} {l_cpu:7.2f}  {l_cpu / n_cpu:6.2f}"
            f"  {statistics.median(native.calls):5.1f} {statistics.median(layered.calls):5.1f}"
            f"  ±{noise:4.1f}%")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.layering", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stores", default="sqlite,postgres,etcd")
    parser.add_argument("--clients", default="1,8")
    parser.add_argument("--seconds", type=float, default=2.0, help="per round and variant")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)

    from bench.peers import Workspace
    from harness import sqlalchemy_url

    ws = Workspace()
    missing = ws.missing()
    header = (f"{'store':8} {'cycle':8} {'cli':>3}  {'native/s':>9} {'layer/s':>9}  {'ratio':>6}"
              f"  {'cpu ms':>7} {'layer':>7}  {'ratio':>6}  {'calls':>5} {'layer':>5}  noise")
    print(header)
    print("-" * len(header))
    try:
        for store in args.stores.split(","):
            if store in missing:
                print(f"{store:8} skipped: {missing[store]}")
                continue
            if store == "sqlite":
                url = f"sqlite:///{ws.dir / 'layering.db'}"
            elif store == "postgres":
                url = sqlalchemy_url(ws.database())
            else:
                url = ws.etcd().extra["url"]
            for clients in (int(c) for c in args.clients.split(",")):
                result = asyncio.run(measure(url, clients, args.seconds, args.rounds,
                                             f"layering-{time.time_ns()}"))
                for line in _report(store, clients, result):
                    print(line, flush=True)
    finally:
        ws.close()
    print("\nratio: layered / native (cycles/s: below 1 is slower; CPU per cycle: above 1 is "
          "dearer); calls: store calls per cycle; noise: spread of the native rounds.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
