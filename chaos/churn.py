"""Background churn for a chaos run: many small acquire/release cycles on locks of their own, so
that lockd always has several requests under way and the PostgreSQL store's batches form (one
statement for the exclusive acquires, and one for the releases, of an event-loop turn: see
``lockd.server.store.postgres.batch``). Without it the workloads' few workers rarely have two
requests in one turn, and a batch's grants would go untested.

``python -m chaos.churn --lockd URL --out FILE [--tasks 8] [--locks 24] [--seed N]`` runs until
SIGTERM: ``tasks`` asyncio tasks, each trying (no wait) a random lock of ``chaos/churn/<i>``,
holding it 0-5 ms, releasing it, pausing 5-30 ms. It judges what it saw, one process being one
observer: a grant on a lock whose last grant here has not yet been sent its release (never two
holders), or whose fence is not above that grant's (fences only rise), is a violation. A
lease lost to expiry (lockd down longer than the TTL) ends that lock's record. At exit it
writes ``{grants, refused, errors, violations: [{kind, detail}]}`` to FILE.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
from pathlib import Path
from typing import Any

from lockd.client.aio import AsyncLockClient
from lockd.client.errors import LeaseLostError, LockClientError

__all__ = ["PREFIX", "Churn", "main"]

PREFIX = "chaos/churn/"
TTL_S = 10.0  # far above any fault's outage, so a lease held a few ms never lapses while held


class Churn:
    """The tasks' shared record: per lock, the fence of the last grant and whether it is held."""

    def __init__(self, locks: int, seed: int) -> None:
        self.names = [f"{PREFIX}{i}" for i in range(locks)]
        self.rng = random.Random(seed)
        self.last: dict[str, int] = {}
        self.held: set[str] = set()
        self.counts = {"grants": 0, "refused": 0, "errors": 0}
        self.violations: list[dict[str, str]] = []

    def granted(self, name: str, fence: int) -> None:
        self.counts["grants"] += 1
        if name in self.held:
            self.violations.append({"kind": "churn_two_holders",
                                    "detail": f"{name} granted (fence {fence}) while held"})
        if fence <= self.last.get(name, 0):
            self.violations.append({"kind": "churn_fence_order",
                                    "detail": f"{name} granted fence {fence} after "
                                              f"{self.last[name]}"})
        self.last[name] = max(fence, self.last.get(name, 0))
        self.held.add(name)

    async def task(self, client: AsyncLockClient) -> None:
        while True:
            name = self.rng.choice(self.names)
            try:
                lease = await client.try_acquire(name, TTL_S, auto_renew=False)
            except LockClientError:
                self.counts["errors"] += 1
                await asyncio.sleep(0.1)
                continue
            if lease is None:
                self.counts["refused"] += 1
            else:
                self.granted(name, lease.fence)
                await asyncio.sleep(self.rng.uniform(0, 0.005))
                # no longer held once its release is sent: lockd may free the lock and grant it
                # to another task before this task hears the release's answer
                self.held.discard(name)
                try:
                    await lease.release()
                except LeaseLostError:
                    pass  # lapsed (lockd away past the TTL): released all the same
                except LockClientError:
                    self.counts["errors"] += 1  # unknown: the lease may stay until its TTL
                    await asyncio.sleep(0.1)
            await asyncio.sleep(self.rng.uniform(0.005, 0.03))


async def _run(args: argparse.Namespace) -> Churn:
    churn = Churn(args.locks, args.seed)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    async with AsyncLockClient(args.lockd, owner="churn", timeout=5.0) as client:
        tasks = [asyncio.create_task(churn.task(client)) for _ in range(args.tasks)]
        await stop.wait()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return churn


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chaos.churn", description=__doc__.splitlines()[0])
    p.add_argument("--lockd", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--locks", type=int, default=24)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    churn = asyncio.run(_run(args))
    out: dict[str, Any] = {**churn.counts, "violations": churn.violations}
    args.out.write_text(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
