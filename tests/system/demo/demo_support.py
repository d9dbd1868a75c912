"""Helpers of the demo tests: run ``python -m lockd.demo`` as a real process, find what it left
behind, and assert the story each scene must tell from its JSON report (data, not printed text)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DemoRun", "MARK_VAR", "assert_story", "marked_processes", "run_demo", "start_demo"]

MARK_VAR = "LOCKD_DEMO_TEST_MARK"
"""An environment variable every process the demo starts inherits: how leftovers are found."""


@dataclass
class DemoRun:
    returncode: int
    stdout: str
    stderr: str
    report: dict[str, Any] | None
    marker: str
    scratch: Path

    def output(self) -> str:
        return f"exit {self.returncode}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


def marked_processes(marker: str) -> list[int]:
    """Pids of live (non-zombie) processes whose environment carries ``MARK_VAR=marker``."""
    needle = f"{MARK_VAR}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            found.append(int(entry.name))
    return found


def _env(tmp_path: Path, extra: dict[str, str] | None) -> tuple[dict[str, str], str, Path]:
    marker = uuid.uuid4().hex
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOCKD_", "PROXY_"))}
    env.update({"TMPDIR": str(scratch), MARK_VAR: marker, **(extra or {})})
    return env, marker, scratch


def start_demo(args: list[str], tmp_path: Path, *, argv0: list[str] | None = None,
               env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str, Path, Path]:
    """Start the demo (its own session, like a terminal job); returns (proc, marker, scratch,
    report path). The report is ``tmp_path/report.json``; TMPDIR is ``scratch``."""
    full_env, marker, scratch = _env(tmp_path, env)
    report = tmp_path / "report.json"
    argv = [*(argv0 or [sys.executable, "-m", "lockd.demo"]), *args, "--json-report", str(report)]
    proc = subprocess.Popen(argv, env=full_env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    return proc, marker, scratch, report


def run_demo(args: list[str], tmp_path: Path, *, timeout: float = 90,
             argv0: list[str] | None = None, env: dict[str, str] | None = None) -> DemoRun:
    """Run the demo to its end and load its JSON report."""
    proc, marker, scratch, report = start_demo(args, tmp_path, argv0=argv0, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        raise AssertionError(f"demo still running after {timeout}s:\n{out}\n{err}") from None
    data = json.loads(report.read_text()) if report.exists() else None
    return DemoRun(proc.returncode, out, err, data, marker, scratch)


def _rows(rows: list[dict[str, Any]]) -> list[tuple[str, int, int]]:
    return [(r["worker"], r["step"], r["fence"]) for r in rows]


def assert_story(report: dict[str, Any], ttl: float = 1.0) -> None:
    """Each scene ended as it must: fences, HTTP results, timings and the rows in the table."""
    assert report["ok"] is True, json.dumps(report["scenes"], indent=1)
    scenes = {s["scene"]: s for s in report["scenes"]}
    assert list(scenes) == ["happy", "crash", "revived", "file"]
    for s in scenes.values():
        assert s["ok"] and all(c["ok"] for c in s["checks"]), s

    happy = scenes["happy"]["facts"]
    fa, fb = happy["fences"]["A"], happy["fences"]["B"]
    assert fb > fa >= 1
    assert [w["http"] for w in happy["writes"]["A"]] == ["201", "201", "201"]
    assert [w["http"] for w in happy["writes"]["B"]] == ["201"]
    assert happy["a_held_s"] > ttl, "A must work longer than its TTL"
    assert happy["renewals"]["A"] >= 2
    assert happy["released"] == {"A": "200", "B": "200"}
    assert 0 <= happy["b_after_release_s"] < 0.5, "the waiter must get the lock at once"
    assert _rows(happy["rows"]) == [("A", 1, fa), ("A", 2, fa), ("A", 3, fa), ("B", 1, fb)]

    crash = scenes["crash"]["facts"]
    fa, fb = crash["fences"]["A"], crash["fences"]["B"]
    assert crash["a_exit"] == -9
    assert fb > fa
    assert 0 < crash["takeover_after_kill_s"] <= ttl + 1.0
    assert [w["http"] for w in crash["writes"]["B"]] == ["201"]
    assert _rows(crash["rows"]) == [("A", 1, fa), ("B", 1, fb)]

    revived = scenes["revived"]["facts"]
    fa, fb = revived["fences"]["A"], revived["fences"]["B"]
    assert fb > fa
    assert revived["frozen_s"] > ttl
    stale = revived["stale"]
    assert (stale["status"], stale["code"]) == (409, "stale_token")
    assert (stale["presented"], stale["highest"]) == (fa, fb)
    assert [w["http"] for w in revived["writes"]["A"]] == ["201"]
    assert [w["http"] for w in revived["writes"]["B"]] == ["201", "201"]
    assert revived["a_released"] is False
    assert revived["a_release_refused"] in ("lease_lost", "local_deadline", "stale_token")
    assert _rows(revived["rows"]) == [("A", 1, fa), ("B", 1, fb), ("B", 2, fb)]

    rejected = [e for e in report["events"]
                if e["scene"] == "revived" and e["event"] == "write_rejected"]
    assert [(e["worker"], e["fence"], e["http"]) for e in rejected] == [
        ("A", fa, "409 stale_token")]
    assert report["rows"] == happy["rows"] + crash["rows"] + revived["rows"]
    assert report["elapsed_s"] < 30

    file = scenes["file"]["facts"]  # the revived holder's output file: refused, B's stands
    fa, fb = file["fences"]["A"], file["fences"]["B"]
    assert fb > fa
    assert (file["stale"]["code"], file["stale"]["presented"], file["stale"]["highest"]) == (
        "stale_token", fa, fb)
    assert [w["http"] for w in file["writes"]["A"]] == ["201"]
    assert [w["http"] for w in file["writes"]["B"]] == ["200"]
    assert file["file"] == {"body": f"B fence {fb} step 1\n", "fence": fb, "version": 2}

