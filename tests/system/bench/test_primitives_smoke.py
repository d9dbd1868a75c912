"""Keeps section 9 (shared locks, semaphores, elections: ``bench/primitives.py``) from rotting:
one short run on lockd · SQLite with 2 clients and 2 handovers per row; every cycle row measured
cycles without errors and every handover row measured its handovers, each ending in a fenced
write the proxy accepted (no timing asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_bench_section_9_primitives_run_and_report(tmp_path: Path, pg_admin_dsn: str) -> None:
    env = {**os.environ, "BENCH_ONLY": "9", "BENCH_PRIMITIVE_CLIENTS": "2",
           "BENCH_PRIMITIVE_STORES": "sqlite", "BENCH_HANDOVERS": "2", "BENCH_SECONDS": "0.5",
           "BENCH_ROUNDS": "1", "BENCH_WARMUP": "0.2", "BENCH_OUT": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "bench"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [section] = json.loads((tmp_path / "latest.json").read_text())["sections"]
    assert section["key"] == "9"
    cycles = [r for r in section["rows"] if r[2] is not None]
    handovers = [r for r in section["rows"] if r[2] is None]
    assert len(cycles) == 5, section["rows"]
    for name, clients, rate, *_, errors in cycles:
        assert clients == 2 and rate > 0 and errors == 0, (name, section["data"])
    labels = {r[0] for r in handovers}
    assert {"lockd · SQLite: kill -9", "lockd · SQLite: resign"} <= labels, labels
    for name, n, _, p50, p99, *_, bad in handovers:
        assert n == 2 and 0 < p50 <= p99 and bad == 0, (name, section["data"][name])
    kill = section["data"]["lockd · SQLite: kill -9"]
    assert min(kill["write_ms"]) > min(section["data"]["lockd · SQLite: resign"]["write_ms"])
