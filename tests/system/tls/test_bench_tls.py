"""The bench's TLS rows run: lock cycles against an https lockd, kept-alive and with a new
connection (a new handshake) every cycle, without errors (no timing asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TLS_ROWS = ["lockd · SQLite · TLS", "lockd · SQLite · TLS, new connection each cycle"]


def test_bench_tls_rows_run_without_errors(tmp_path: Path) -> None:
    env = {**os.environ, "BENCH_ONLY": "1", "BENCH_PEERS": "TLS", "BENCH_CLIENTS": "2",
           "BENCH_SECONDS": "0.5", "BENCH_ROUNDS": "1", "BENCH_WARMUP": "0.1",
           "BENCH_OUT": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "bench"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [section] = json.loads((tmp_path / "latest.json").read_text())["sections"]
    rows = {r[0]: r for r in section["rows"]}
    for name in TLS_ROWS:
        _, clients, rate, *_, errors = rows[name]
        assert clients == 2 and rate > 0 and errors == 0, (name, section["data"])
