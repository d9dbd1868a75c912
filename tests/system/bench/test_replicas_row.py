"""Section 1's replicas row: two ``lockd serve`` processes on one PostgreSQL store and one key
directory, the generator's clients split between them round-robin."""

from __future__ import annotations

import asyncio
import re

import httpx

from bench.loadgen import make_clients
from bench.peers import Workspace


def _granted(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = re.search(r'^lockd_acquires_total\{outcome="granted"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def test_two_replicas_share_store_and_keys_and_the_clients_alternate(pg_url: str) -> None:
    ws = Workspace()
    try:
        replicas = ws.lockd_replicas(pg_url, "t-replica", 2)
        urls = [f"http://{r.host}:{r.port}" for r in replicas]
        assert len({r.port for r in replicas}) == 2
        # one key directory: both publish the same keys, so either's tokens verify anywhere
        keys = [httpx.get(f"{u}/v1/keys", timeout=10).json() for u in urls]
        assert keys[0] == keys[1] and keys[0]["keys"]
        spec = {"workload": "lockd", "prefix": "rr", **replicas[0].addr(),
                "replicas": [[r.host, r.port] for r in replicas]}

        async def cycles() -> None:
            made = await make_clients(spec, [0, 1, 2])  # 0 and 2 on the first, 1 on the second
            try:
                for cycle, _ in made:
                    await cycle()
            finally:
                await asyncio.gather(*(close() for _, close in made))

        asyncio.run(cycles())
        assert [_granted(u) for u in urls] == [2.0, 1.0]
        # one store: a lock held through one replica is held at the other
        held = httpx.post(f"{urls[0]}/v1/locks/rr/shared/acquire", json={"ttl_ms": 30_000},
                          timeout=10)
        assert held.status_code == 200
        other = httpx.post(f"{urls[1]}/v1/locks/rr/shared/acquire", json={"ttl_ms": 30_000},
                           timeout=10)
        assert other.status_code == 409
    finally:
        ws.close()
