"""The conformance scenarios (conformance/scenarios/*.json) pass with every client's runner
against a real lockd and proxy; a deliberately wrong scenario fails with each of them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.clients.conftest import ROOT

SCENARIOS = sorted((ROOT / "conformance" / "scenarios").glob("*.json"))
BROKEN = Path(__file__).parent / "broken" / "revived_holder_broken.json"


@pytest.fixture(params=["python", "go"])
def runner(request, servers):
    """``run(paths)``: (exit status, one dict per scenario) of a client's runner."""
    lockd, proxy = servers
    if request.param == "python":
        argv = [sys.executable, "-m", "tests.clients.runner", "--lockd", lockd.url,
                "--proxy", proxy.url]
    else:
        binary = request.getfixturevalue("go_build")("./cmd/conformance")
        argv = [str(binary), "-lockd", lockd.url, "-proxy", proxy.url]

    def run(paths: list[Path]) -> tuple[int, list[dict]]:
        done = subprocess.run([*argv, *map(str, paths)], cwd=ROOT, capture_output=True,
                              text=True, timeout=300)
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        assert len(lines) == len(paths), done.stdout + done.stderr
        return done.returncode, lines

    run.client = request.param
    return run


def test_the_scenarios_cover_the_contract():
    names = {path.stem for path in SCENARIOS}
    assert {"exclusion", "waiting", "renewal", "lost", "revived_holder", "shared", "multi",
            "semaphore", "election", "refusals"} <= names
    for path in SCENARIOS:
        scenario = json.loads(path.read_text())
        assert scenario["name"] == path.stem and scenario["description"] and scenario["steps"]


def test_every_scenario_passes(runner):
    status, results = runner(SCENARIOS)
    failures = [r for r in results if not r["ok"]]
    assert status == 0 and not failures, failures
    assert all(r["client"] == runner.client for r in results)
    assert [r["scenario"] for r in results] == [p.stem for p in SCENARIOS]


def test_a_wrong_scenario_fails(runner):
    status, [result] = runner([BROKEN])
    assert status == 1
    assert not result["ok"]
    assert result["failure"].startswith("step 5 (write): expected success, got stale_token"), result
