"""Keeps ``python -m bench.layering`` from rotting: one short run on SQLite with 2 clients
prints a row per cycle with both variants measured (no timing asserted), and the recipes keep
their word: a permit is a slot lock below the limit, a campaign is the lock's exclusive grant."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

from bench.layering import LayeredElection, LayeredSemaphore
from lockd.server.store.sqlite import SqliteStore

ROOT = Path(__file__).resolve().parents[3]


def test_the_layering_bench_runs_and_reports_both_variants() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.layering", "--stores", "sqlite",
                           "--clients", "2", "--seconds", "0.2", "--rounds", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("sqlite ")]
    assert [r[1] for r in rows] == ["permit", "campaign"], done.stdout
    for row in rows:
        assert float(row[3]) > 0 and float(row[4]) > 0, row  # native/s, layered/s


def test_the_recipes_hold_at_most_limit_permits_and_one_leader(tmp_path: Path) -> None:
    async def main() -> None:
        store = SqliteStore(str(tmp_path / "l.db"), clock=time.time)
        await store.open()
        try:
            sem, election = LayeredSemaphore(store), LayeredElection(store)
            held = [await sem.acquire("s", 2, f"lease{i}", "o") for i in range(3)]
            assert held == ["sem/s/0", "sem/s/1", None]
            await sem.release("sem/s/0", "lease0")
            assert await sem.acquire("s", 2, "lease3", "o") == "sem/s/0"
            assert await election.campaign("e", "a", "a", "va")
            assert not await election.campaign("e", "b", "b", "vb")
            assert (await store.elect_get("e")).value == "va"
            await election.resign("e", "a")
            assert (await store.get("e")).held is False
        finally:
            await store.close()

    asyncio.run(main())
