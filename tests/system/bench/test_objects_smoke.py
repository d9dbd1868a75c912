"""Keeps section 10 (fenced objects, ``bench/objects.py``) from rotting: one short run with
2 clients; every row (directory and S3, through the proxy and straight) measured PUTs without
errors, and the goals table has its four §10 rows, each with the design floor and the HTTP ceiling in its
limit cell (no
timing asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.objects import BLOB_ONLY, CEILING, FLOOR, KEYED

ROOT = Path(__file__).resolve().parents[3]


def test_bench_section_10_objects_run_and_report(tmp_path: Path, pg_admin_dsn: str) -> None:
    env = {**os.environ, "BENCH_ONLY": "10", "BENCH_PROXY_CLIENTS": "2", "BENCH_SECONDS": "1",  # a moto PUT beside busy workers can take 0.5 s
           "BENCH_ROUNDS": "1", "BENCH_WARMUP": "0.2", "BENCH_OUT": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "bench"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    sections = {s["key"]: s for s in json.loads((tmp_path / "latest.json").read_text())["sections"]}
    ten = sections["10"]
    paths = {row[0] for row in ten["rows"]}
    assert {"fenced PUT through the proxy", "fenced PUT through the proxy on S3",
            "PUT straight to the S3 server (moto, baseline)", BLOB_ONLY, KEYED, CEILING,
            FLOOR} <= paths, paths
    for name, size, clients, rate, *_, errors in ten["rows"]:
        assert clients in (1, 2) and rate > 0 and errors == 0, (name, size, ten["data"])
    # 16 directory and S3 rows, the 4 KiB keyed and blob-only proxy at 1 and 2 clients, the
    # ceiling's 4, the design floor's 4
    assert len(ten["rows"]) == 28
    goals = [g for g in sections["G"]["data"] if g.startswith("§10")]
    assert len(goals) == 4, goals
    assert all("HTTP ceiling" in sections["G"]["data"][g]["limit"]
               and "design floor" in sections["G"]["data"][g]["limit"] for g in goals), goals
