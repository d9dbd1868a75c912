"""``lockctl`` as a real process against a real lockd: shared locks (``--shared``), semaphores
(``sem acquire|release|status|run``) and elections (``elect``, ``leader``, ``observe``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from harness import VENV_BIN, run_program, wait_for
from lockd import LockClient
from lockd.client.lockctl import EXIT_LEASE_LOST, EXIT_NOT_ACQUIRED, EXIT_USAGE
from tests.client.conftest import LockdServer

LOCKCTL = str(VENV_BIN / "lockctl")
ADMIN_KEY = "admin-key-Elect0rHandover"


def lockctl(url: str, *args: str, timeout: float = 60, stdin: str | None = None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKD_")}
    return run_program([LOCKCTL, "--url", url, *args], text=True, timeout=timeout, env=env,
                       input=stdin)


def _env_dump(path: Path, *names: str) -> list[str]:
    script = "; ".join(f'echo "${n}"' for n in names)
    return ["sh", "-c", f"({script}) > {path}"]


# --------------------------------------------------------------------------- shared locks


def test_acquire_shared_twice_and_status_shows_the_readers(shared_lockd, name):
    url = shared_lockd.url
    first = lockctl(url, "--json", "acquire", name, "--ttl", "30s", "--shared", "--owner", "r1")
    second = lockctl(url, "--json", "acquire", name, "--ttl", "30s", "--shared", "--owner", "r2")
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert a["mode"] == b["mode"] == "shared" and a["fence"] == b["fence"]
    status = json.loads(lockctl(url, "--json", "status", name).stdout)
    assert status["mode"] == "shared"
    assert sorted(h["owner"] for h in status["holders"]) == ["r1", "r2"]
    r = lockctl(url, "status", name)
    assert r.stdout.startswith(f"{name}: held shared by 2: 'r1', 'r2' (fence {a['fence']}, ")
    r = lockctl(url, "--json", "holders", name)
    assert json.loads(r.stdout)["mode"] == "shared"
    assert [h["owner"] for h in json.loads(r.stdout)["holders"]] == ["r1", "r2"]
    r = lockctl(url, "acquire", name, "--ttl", "5s")          # a writer waits for readers
    assert r.returncode == EXIT_NOT_ACQUIRED and "--wait" in r.stderr
    for lease in (a, b):
        assert lockctl(url, "release", name, "-", stdin=lease["lease_id"]).returncode == 0


def test_run_shared_tells_the_command_its_mode(shared_lockd, name, tmp_path):
    out = tmp_path / "env"
    r = lockctl(shared_lockd.url, "run", name, "--ttl", "10s", "--shared", "--",
                *_env_dump(out, "LOCKD_MODE", "LOCKD_LOCK"))
    assert r.returncode == 0, r.stderr
    assert out.read_text().split() == ["shared", name]
    with LockClient(shared_lockd.url) as client:
        reader = client.acquire(name + "-b", 10, shared=True)     # another reader of one lock
        r = lockctl(shared_lockd.url, "run", name, "--lock", name + "-b", "--ttl", "10s",
                    "--shared", "--", *_env_dump(out, "LOCKD_MODE", "LOCKD_LOCKS"))
        assert r.returncode == 0, r.stderr                   # both held shared: no wait
        assert out.read_text().split() == ["shared", f"{name},{name}-b"]
        client.release(reader)


# --------------------------------------------------------------------------- semaphores


def test_sem_acquire_status_release_and_limits(shared_lockd, name):
    url = shared_lockd.url
    permits = []
    for owner in ("a", "b"):
        r = lockctl(url, "--json", "sem", "acquire", name, "--limit", "2", "--ttl", "30s",
                    "--owner", owner)
        assert r.returncode == 0, r.stderr
        permits.append(json.loads(r.stdout))
    assert [p["slot"] for p in permits] == [0, 1] and permits[0]["lock"] == f"sem/{name}/0"
    r = lockctl(url, "sem", "acquire", name, "--limit", "2", "--ttl", "30s", "--wait", "200ms")
    assert r.returncode == EXIT_NOT_ACQUIRED and "full" in r.stderr
    r = lockctl(url, "sem", "acquire", name, "--limit", "3", "--ttl", "30s")
    assert r.returncode == EXIT_USAGE and "2" in r.stderr          # the current limit
    r = lockctl(url, "sem", "status", name)
    assert r.stdout.startswith(f"{name}: 2 of 2 permits held") and "owner 'b'" in r.stdout
    status = json.loads(lockctl(url, "--json", "sem", "status", name).stdout)
    assert [(p["slot"], p["owner"]) for p in status["permits"]] == [(0, "a"), (1, "b")]
    r = lockctl(url, "--json", "sem", "release", name, "-", stdin=permits[0]["lease_id"])
    assert r.returncode == 0 and json.loads(r.stdout) == {"semaphore": name, "released": True}
    r = lockctl(url, "sem", "release", name, permits[0]["lease_id"])
    assert r.returncode == EXIT_LEASE_LOST
    r = lockctl(url, "sem", "release", name, "-", stdin=permits[1]["lease_id"])
    assert r.stdout.strip() == f"released a permit of {name}"
    assert json.loads(lockctl(url, "--json", "sem", "status", name).stdout)["permits"] == []


def test_sem_run_gives_the_command_its_slot_and_token(shared_lockd, name, tmp_path):
    out = tmp_path / "env"
    r = lockctl(shared_lockd.url, "sem", "run", name, "--limit", "4", "--ttl", "10s", "--",
                *_env_dump(out, "LOCKD_SEMAPHORE", "LOCKD_SLOT", "LOCKD_LOCK", "LOCKD_FENCE"))
    assert r.returncode == 0, r.stderr
    semaphore, slot, lock, fence = out.read_text().split()
    assert (semaphore, slot, lock) == (name, "0", f"sem/{name}/0") and int(fence) >= 1
    assert lockctl(shared_lockd.url, "sem", "run", name, "--limit", "4", "--ttl", "10s", "--",
                   "sh", "-c", "exit 3").returncode == 3
    with LockClient(shared_lockd.url) as client:
        assert client.semaphore_status(name).permits == ()
    r = lockctl(shared_lockd.url, "sem", "run", name, "--limit", "4", "--ttl", "10s")
    assert r.returncode == EXIT_USAGE and "needs a command" in r.stderr


# --------------------------------------------------------------------------- elections


def test_elect_runs_the_command_as_leader_then_resigns(shared_lockd, name, tmp_path):
    url = shared_lockd.url
    out = tmp_path / "env"
    r = lockctl(url, "elect", name, "--value", "host-a:80", "--owner", "a", "--",
                *_env_dump(out, "LOCKD_ELECTION", "LOCKD_LOCK", "LOCKD_VALUE", "LOCKD_FENCE"))
    assert r.returncode == 0, r.stderr
    election, lock, value, fence = out.read_text().split()
    assert (election, lock, value) == (name, name, "host-a:80") and int(fence) >= 1
    r = lockctl(url, "leader", name)
    assert r.stdout.startswith(f"{name}: no leader (last fence {fence}")


def test_elect_waits_for_the_lead_and_leader_prints_it(shared_lockd, name):
    url = shared_lockd.url
    with LockClient(url) as client:
        lease = client.campaign(name, "web-1", 30, owner="web-1")
        r = lockctl(url, "elect", name, "--value", "web-2", "--wait", "300ms", "--", "true")
        assert r.returncode == EXIT_NOT_ACQUIRED and "--wait" in r.stderr
        r = lockctl(url, "leader", name)
        assert r.stdout.startswith(f"{name}: led by 'web-1' (fence {lease.fence}, value 'web-1'")
        doc = json.loads(lockctl(url, "--json", "leader", name).stdout)
        assert doc["leader"]["owner"] == "web-1" and doc["value"] == "web-1"
        client.resign(lease)


def test_elect_stops_the_command_when_the_lead_is_lost(lockd_server, name, tmp_path):
    started = tmp_path / "started"
    proc = subprocess.Popen(
        [LOCKCTL, "--url", lockd_server.url, "elect", name, "--ttl", "8s", "--renew-every",
         "300ms", "--grace", "500ms", "--", "sh", "-c", f"touch {started}; sleep 60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(started.exists, timeout=20, what="the command started")
        lockd_server.restart(fresh_store=True)       # the lead is unknown there: 410
        rc = proc.wait(20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == EXIT_LEASE_LOST, proc.stderr.read()


@pytest.fixture
def admin_lockd():
    workdir = Path(tempfile.mkdtemp(prefix="lockd-elect-"))
    server = LockdServer(workdir, env={"LOCKD_ADMIN_KEYS": ADMIN_KEY}).start()
    yield server
    server.stop()
    shutil.rmtree(workdir, ignore_errors=True)


def test_elect_hands_over_when_an_admin_asks(admin_lockd, name, tmp_path):
    log = tmp_path / "log"
    child = f"trap 'echo TERM >> {log}; exit 0' TERM; echo started >> {log}; " \
            "while true; do sleep 0.1; done"
    proc = subprocess.Popen(
        [LOCKCTL, "--url", admin_lockd.url, "elect", name, "--value", "a", "--owner", "a",
         "--ttl", "3s", "--renew-every", "200ms", "--", "sh", "-c", child],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: log.exists() and "started" in log.read_text(), timeout=20,
                 what="the command started")
        with LockClient(admin_lockd.url, api_key=ADMIN_KEY) as admin:
            assert admin.handover(name, "next") == "next"
            rc = proc.wait(20)
            assert admin.leader(name).leader is None      # it resigned
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
    stderr = proc.stderr.read()
    assert rc == 0, stderr                               # the command's own status
    assert "hand over" in stderr and log.read_text().split() == ["started", "TERM"]


def test_observe_prints_each_change_as_it_happens(shared_lockd, name):
    url = shared_lockd.url
    proc = subprocess.Popen([LOCKCTL, "--url", url, "--json", "observe", name],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = json.loads(proc.stdout.readline())
        assert (first["kind"], first["owner"]) == ("state", None)
        with LockClient(url) as client:
            lease = client.campaign(name, "v1", 10, owner="o")
            client.proclaim(lease, "v2")
            client.resign(lease)
        lines = [json.loads(proc.stdout.readline()) for _ in range(3)]
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(10)
    assert [(e["kind"], e["value"]) for e in lines] == [("leader", "v1"), ("proclaim", "v2"),
                                                        ("resign", "")]
    assert rc == 0


def test_help_is_plain_text_for_every_new_command():
    for args in (["sem", "--help"], ["sem", "run", "--help"], ["elect", "--help"],
                 ["leader", "--help"], ["observe", "--help"], ["acquire", "--help"]):
        r = subprocess.run([LOCKCTL, *args], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and r.stdout.startswith("usage: lockctl"), args
        assert "\x1b[" not in r.stdout
    r = subprocess.run([LOCKCTL, "acquire", "--help"], capture_output=True, text=True, timeout=30)
    assert "--shared" in r.stdout
    started = time.monotonic()
    r = subprocess.run([LOCKCTL, "elect", "x"], capture_output=True, text=True, timeout=30)
    assert r.returncode == EXIT_USAGE and "needs a command" in r.stderr
    assert time.monotonic() - started < 30
