"""Keeps section 5 (fenced single-row writes) from rotting: one short run on PostgreSQL with 2
clients; every row, the ``--workers`` rows and the PostgreSQL-limit rows included, measured
writes without errors (no timing asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_bench_section_5_proxy_rows_run_and_report(tmp_path: Path, pg_admin_dsn: str) -> None:
    # a 1 s warm-up: a batch of 100 rows takes 0.2-0.3 s on a loaded 2-core machine, and its
    # first one more, so a shorter warm-up can leave no whole batch in the counted window
    env = {**os.environ, "BENCH_ONLY": "5", "BENCH_PROXY_CLIENTS": "2", "BENCH_SECONDS": "1",
           "BENCH_ROUNDS": "1", "BENCH_WARMUP": "1", "BENCH_OUT": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "bench"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    sections = json.loads((tmp_path / "latest.json").read_text())["sections"]
    assert [s["key"] for s in sections] == ["G", "5"]  # the goals table comes first
    section = sections[1]
    goals = {row[0]: row for row in sections[0]["rows"]}
    assert goals["§5 through the proxy (PUT, fenced) vs direct fenced, 2 clients"][2] == "≥ 0.6×"
    names = [row[0] for row in section["rows"]]
    assert section["key"] == "5" and len(names) == 12, names
    assert "fenced_transaction, psycopg (claim + UPDATE)" in names
    assert any(n.startswith("SQL-PATH FLOOR") for n in names), names
    ftx = goals["§5 fenced_transaction, psycopg (claim + UPDATE) vs direct fenced, 2 clients"]
    assert "two-round-trip floor" in ftx[3], ftx  # the goal's limit, beside it
    for name, clients, rate, *_, errors in section["rows"]:
        assert rate > 0 and errors == 0, (name, section["data"])
        assert clients == (8 if name.startswith("PostgreSQL limit") else 2), name
    assert sum("--workers" in n for n in names) == 2
    assert sum(n.startswith("PostgreSQL limit") for n in names) == 2


def test_bench_section_5_fenced_transaction_row_alone(tmp_path: Path, pg_admin_dsn: str) -> None:
    """``BENCH_PEERS`` narrows section 5 to the fenced_transaction row and its baseline: both
    write without errors through the installed fence triggers, and the goal row is ≥ 0.8×."""
    env = {**os.environ, "BENCH_ONLY": "5", "BENCH_PEERS": "fenced_transaction",
           "BENCH_PROXY_CLIENTS": "2", "BENCH_SECONDS": "0.5", "BENCH_ROUNDS": "1",
           "BENCH_WARMUP": "0.2", "BENCH_OUT": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "bench"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    goals, section = json.loads((tmp_path / "latest.json").read_text())["sections"]
    assert [row[0] for row in section["rows"]] == [
        "direct fenced statement, psycopg (baseline)",
        "fenced_transaction, psycopg (claim + UPDATE)"]
    for name, _, rate, *_, errors in section["rows"]:
        assert rate > 0 and errors == 0, (name, section["data"])
    [goal] = goals["rows"]
    assert goal[0] == "§5 fenced_transaction, psycopg (claim + UPDATE) vs direct fenced, 2 clients"
    assert goal[2] == "≥ 0.8×"
