"""Keeps bench/ from rotting: one short run of section 1 on lockd with SQLite (no timing asserted).

``python -m bench`` runs for real (lockd as a process, the load generator in its own process)
with 2 clients for 1 s; the test checks that the run completes, writes its files, and measured
lock cycles without errors. Other peers are filtered out (``BENCH_PEERS``), except etcd's
baseline when an ``etcd`` binary is installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_bench_section_1_on_sqlite_runs_and_reports(tmp_path: Path) -> None:
    env = {**os.environ, "BENCH_ONLY": "1", "BENCH_PEERS": "SQLite", "BENCH_CLIENTS": "2",
           "BENCH_SECONDS": "1", "BENCH_ROUNDS": "1", "BENCH_WARMUP": "0.2",
           "BENCH_OUT": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "bench"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Lock cycles" in done.stdout
    doc = json.loads((tmp_path / "latest.json").read_text())
    sections = {s["key"]: s for s in doc["sections"]}
    section = sections["1"]
    if "etcd lock API (baseline)" in {r[0] for r in section["rows"]}:
        # the goals table comes first, read off this run's section 1
        assert doc["sections"][0]["key"] == "G"
        [goal] = [r for r in sections["G"]["rows"] if "lockd · SQLite" in r[0]]
        assert goal[2] == "≥ 3×" and goal[4] in ("met", "NOT met")
        # the limit rows run whatever BENCH_PEERS says: one lockd's HTTP ceiling is beside it
        assert "one-process HTTP ceiling" in goal[3]
    rows = [r for r in section["rows"] if r[0] == "lockd · SQLite"]
    assert len(rows) == 1
    _, clients, rate, *_, cpu_ms, errors = rows[0]
    assert clients == 2 and rate > 0 and errors == 0
    # the CPU the counted window cost, per cycle: the machine's, and lockd's own within it
    split = section["data"]["lockd · SQLite @2"]["cpu_ms"]
    assert cpu_ms == split["machine"] and 0 < split["servers"] < split["machine"]
    assert split["generator"] > 0
    assert doc["machine"]["nproc"] >= 1
    assert (tmp_path / "latest.md").read_text().startswith("# lockd benchmarks")
    if importlib.util.find_spec("matplotlib") is not None:  # the bench extra is installed
        assert (tmp_path / "latest.png").stat().st_size > 1000
