"""Keeps section 8 (fenced transfers, ``bench/transfer.py``) from rotting: one short run on
PostgreSQL with 2 clients; every row measured transfers without errors (no timing asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_bench_section_8_transfers_run_and_report(tmp_path: Path, pg_admin_dsn: str) -> None:
    env = {**os.environ, "BENCH_ONLY": "8", "BENCH_PROXY_CLIENTS": "2", "BENCH_SECONDS": "0.5",
           "BENCH_ROUNDS": "1", "BENCH_WARMUP": "0.2", "BENCH_OUT": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "bench"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [section] = json.loads((tmp_path / "latest.json").read_text())["sections"]
    assert section["key"] == "8" and len(section["rows"]) == 3
    for name, clients, rate, *_, errors in section["rows"]:
        assert clients == 2 and rate > 0 and errors == 0, (name, section["data"])
    assert any("through the proxy" in row[0] for row in section["rows"])
