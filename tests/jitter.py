"""Random holds for the race tests: simulated work, so that leases, sets and renewals interleave.

A hold is never a wait for something to happen (those poll with ``harness.wait_for``); it only
spreads the workers' steps in time. ``hold`` is for event loops, ``hold_sync`` for threads.
"""

from __future__ import annotations

import asyncio
import random
import time


async def hold(rnd: random.Random | None, max_s: float, min_s: float = 0.0) -> None:
    """Pause this task ``min_s`` plus up to ``max_s`` seconds (``rnd`` None: exactly ``max_s``)."""
    span = min_s + (max_s if rnd is None else rnd.random() * max_s)
    await asyncio.sleep(span)  # proves: nothing; simulated work that spreads the workers' steps


def hold_sync(rnd: random.Random | None, max_s: float, min_s: float = 0.0) -> None:
    """``hold`` for threads: blocks this thread ``min_s`` plus up to ``max_s`` seconds."""
    span = min_s + (max_s if rnd is None else rnd.random() * max_s)
    time.sleep(span)  # proves: nothing; simulated work that spreads the workers' steps
