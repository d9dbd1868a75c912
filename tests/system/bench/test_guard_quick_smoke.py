"""Keeps ``bench.guard_quick`` from rotting: both rows (guarded FastAPI write vs unguarded, fenced
Redis SET vs plain SET) run briefly and print a rate and a ratio (no timing asserted)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import require
from tests.guard.conftest import redis_reason

ROOT = Path(__file__).resolve().parents[3]


def test_both_rows_run_and_print_ratios() -> None:
    require(redis_reason(), "Redis 7")
    done = subprocess.run([sys.executable, "-m", "bench.guard_quick", "--seconds", "0.5",
                           "--clients", "2", "--rounds", "1"], cwd=ROOT, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if re.search(r"\d\.\d\dx", line)]
    assert [r.split("  ")[0] for r in rows] == ["guarded FastAPI write (SQLite)",
                                                "fenced Redis SET (FCALL)"], done.stdout
    for row in rows:
        numbers = [float(n) for n in re.findall(r"\s(\d+)\s", row)]
        assert len(numbers) >= 3 and all(n > 0 for n in numbers), row
