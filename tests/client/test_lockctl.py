"""``lockctl`` as a real process against a real lockd: subcommands, output, exit codes, and
``run`` stopping its command when the lease is lost."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import VENV_BIN, free_port, run_program, wait_for
from lockd import LockClient
from lockd.client.lockctl import EXIT_LEASE_LOST, EXIT_NOT_ACQUIRED, EXIT_UNAVAILABLE, EXIT_USAGE

LOCKCTL = str(VENV_BIN / "lockctl")


def lockctl(url: str, *args: str, timeout: float = 30, env: dict | None = None):
    return run_program([LOCKCTL, "--url", url, *args], text=True, timeout=timeout,
                       env={**os.environ, **(env or {})})


def test_documented_exit_codes():
    assert (EXIT_NOT_ACQUIRED, EXIT_LEASE_LOST, EXIT_UNAVAILABLE, EXIT_USAGE) == (75, 79, 69, 2)


def test_acquire_status_renew_release_ls_json(shared_lockd, name):
    url = shared_lockd.url
    r = lockctl(url, "--json", "acquire", name, "--ttl", "5s", "--owner", "ops")
    assert r.returncode == 0, r.stderr
    lease = json.loads(r.stdout)
    assert set(lease) == {"lock", "lease_id", "fence", "token", "ttl_ms", "owner"}
    assert lease["lock"] == name and lease["ttl_ms"] == 5000 and lease["owner"] == "ops"

    r = lockctl(url, "status", name, "--json")  # --json after the subcommand works too
    status = json.loads(r.stdout)
    assert status["held"] and status["fence"] == lease["fence"] and status["owner"] == "ops"

    r = lockctl(url, "--json", "acquire", name, "--ttl", "5s", "--wait", "200ms")
    assert r.returncode == EXIT_NOT_ACQUIRED
    assert json.loads(r.stderr)["error"] == "held"

    r = lockctl(url, "--json", "renew", name, lease["lease_id"], "--ttl", "20s")
    assert r.returncode == 0, r.stderr
    renewed = json.loads(r.stdout)
    assert renewed["fence"] == lease["fence"] and renewed["ttl_ms"] == 20000

    r = lockctl(url, "--json", "ls", "--prefix", name)
    assert [i["lock"] for i in json.loads(r.stdout)["items"]] == [name]

    r = lockctl(url, "--json", "release", name, lease["lease_id"])
    assert r.returncode == 0 and json.loads(r.stdout) == {"lock": name, "released": True}
    r = lockctl(url, "release", name, lease["lease_id"])
    assert r.returncode == EXIT_LEASE_LOST and "lease" in r.stderr.lower()
    r = lockctl(url, "renew", name, lease["lease_id"])
    assert r.returncode == EXIT_LEASE_LOST
    assert json.loads(lockctl(url, "--json", "status", name).stdout)["held"] is False


def test_human_output(shared_lockd, name):
    url = shared_lockd.url
    r = lockctl(url, "acquire", name, "--ttl", "2m", "--owner", "alice")
    assert r.returncode == 0
    assert r.stdout.startswith(f"acquired {name}\n") and "ttl       2m" in r.stdout
    lease_id = next(line.split()[1] for line in r.stdout.splitlines() if "lease_id" in line)
    r = lockctl(url, "status", name)
    assert r.stdout.startswith(f"{name}: held by 'alice' (fence ")
    r = lockctl(url, "ls", "--prefix", name)
    assert r.stdout.splitlines()[0].split() == ["LOCK", "HELD", "FENCE", "TTL", "WAITERS", "OWNER"]
    assert r.stdout.splitlines()[1].startswith(name)
    assert lockctl(url, "release", name, lease_id).stdout.strip() == f"released {name}"
    assert ": free (last fence" in lockctl(url, "status", name).stdout


def test_usage_and_unavailable_exit_codes(shared_lockd, name):
    url = shared_lockd.url
    assert lockctl(url, "acquire", name, "--ttl", "30").returncode == EXIT_USAGE  # no unit
    assert lockctl(url, "acquire", name, "--ttl", "soon").returncode == EXIT_USAGE
    assert lockctl(url, "acquire", name).returncode == EXIT_USAGE  # --ttl missing
    assert lockctl(url, "run", name, "--ttl", "1s").returncode == EXIT_USAGE  # no -- COMMAND
    r = lockctl(url, "acquire", "bad name!", "--ttl", "1s")
    assert r.returncode == EXIT_USAGE and "422" in r.stderr  # lockd said 422
    dead = f"http://127.0.0.1:{free_port()}"
    assert lockctl(dead, "status", name).returncode == EXIT_UNAVAILABLE
    # --url defaults to $LOCKD_URL
    r = subprocess.run([LOCKCTL, "status", name, "--json"], capture_output=True, text=True,
                       env={**os.environ, "LOCKD_URL": url}, timeout=30)
    assert r.returncode == 0 and json.loads(r.stdout)["lock"] == name


def _claims(token: str) -> dict:
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def test_run_passes_the_fence_and_the_commands_status(shared_lockd, name, tmp_path):
    url = shared_lockd.url
    out = tmp_path / "env.json"
    script = ("import json, os, sys; json.dump({k: os.environ[k] for k in "
              "('LOCKD_LOCK', 'LOCKD_FENCE', 'LOCKD_TOKEN')}, open(sys.argv[1], 'w')); sys.exit(7)")
    r = lockctl(url, "run", name, "--ttl", "5s", "--", sys.executable, "-c", script, str(out))
    assert r.returncode == 7, r.stderr
    env = json.loads(out.read_text())
    fence = int(env["LOCKD_FENCE"])
    assert env["LOCKD_LOCK"] == name and fence >= 1
    claims = _claims(env["LOCKD_TOKEN"])
    assert (claims["lock"], claims["fence"]) == (name, fence)
    status = json.loads(lockctl(url, "--json", "status", name).stdout)
    assert status["held"] is False and status["fence"] == fence  # released after the command
    assert lockctl(url, "run", name, "--ttl", "5s", "--", "true").returncode == 0
    r = lockctl(url, "run", name, "--ttl", "5s", "--", "sh", "-c", "kill -9 $$")
    assert r.returncode == 128 + signal.SIGKILL
    r = lockctl(url, "run", name, "--ttl", "5s", "--", str(tmp_path / "no-such-command"))
    assert r.returncode == 127
    assert json.loads(lockctl(url, "--json", "status", name).stdout)["held"] is False


def test_run_does_not_start_the_command_when_not_acquired(shared_lockd, name, tmp_path):
    marker = tmp_path / "ran"
    with LockClient(shared_lockd.url) as client, client.lock(name, ttl=5.0):
        r = lockctl(shared_lockd.url, "run", name, "--ttl", "2s", "--wait", "300ms", "--",
                    "touch", str(marker))
    assert r.returncode == EXIT_NOT_ACQUIRED
    assert not marker.exists()
    assert "held" in r.stderr


def test_run_forwards_sigterm_to_the_command_and_releases(shared_lockd, name, tmp_path):
    started = tmp_path / "started"
    proc = subprocess.Popen([LOCKCTL, "--url", shared_lockd.url, "run", name, "--ttl", "5s", "--",
                             "sh", "-c", f"touch {started}; exec sleep 30"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(started.exists, timeout=10, what="command started")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 128 + signal.SIGTERM
    assert json.loads(lockctl(shared_lockd.url, "--json", "status", name).stdout)["held"] is False


def _child_script(path: Path, ignore_term: bool) -> list[str]:
    code = f"""
import signal, sys, threading, pathlib
log = pathlib.Path({str(path)!r})
def on_term(*_):
    log.write_text(log.read_text() + "TERM\\n")
    if not {ignore_term}:
        sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
log.write_text("started\\n")
threading.Event().wait(60)  # runs until stopped (at most a minute)
"""
    return [sys.executable, "-c", code]


@pytest.mark.parametrize("ignore_term", [False, True], ids=["stops-on-term", "ignores-term"])
def test_run_stops_the_command_soon_after_the_lease_is_lost(lockd_server, name, tmp_path,
                                                            ignore_term):
    """lockd comes back on a NEW store: the lease is unknown there, the next renewal gets 410,
    and lockctl stops the command (SIGTERM; SIGKILL after --grace) and exits 79."""
    log = tmp_path / "child.log"
    proc = subprocess.Popen(
        [LOCKCTL, "--url", lockd_server.url, "run", name, "--ttl", "8s", "--renew-every", "300ms",
         "--grace", "500ms", "--", *_child_script(log, ignore_term)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: log.exists() and "started" in log.read_text(), timeout=10,
                 what="command started")
        lockd_server.restart(fresh_store=True)
        back_at = time.monotonic()
        rc = proc.wait(10)
        stopped_after = time.monotonic() - back_at
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = proc.stderr.read()
    assert rc == EXIT_LEASE_LOST, stderr
    assert "410" in stderr  # lost by lockd's answer, not by the local deadline
    assert log.read_text().splitlines() == ["started", "TERM"]
    limit = 1.5 + (0.5 if ignore_term else 0.0)  # renewal period + stop (+ grace)
    assert stopped_after < limit, stopped_after


def test_lease_id_from_the_environment_or_stdin_not_the_command_line(shared_lockd, name):
    """A lease id is a secret; renew/release take it from LOCKD_LEASE_ID or
    standard input (``-``), so it need not show in ``ps`` or shell history."""
    url = shared_lockd.url
    lease = json.loads(lockctl(url, "--json", "acquire", name, "--ttl", "5s").stdout)
    env = {"LOCKD_LEASE_ID": lease["lease_id"]}
    r = lockctl(url, "--json", "renew", name, "--ttl", "20s", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ttl_ms"] == 20000
    r = subprocess.run([LOCKCTL, "--url", url, "--json", "release", name, "-"], text=True,
                       input=lease["lease_id"] + "\n", capture_output=True, timeout=30,
                       env={k: v for k, v in os.environ.items() if k != "LOCKD_LEASE_ID"})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"lock": name, "released": True}
    assert lease["lease_id"] not in r.stdout + r.stderr
    no_id = {k: v for k, v in os.environ.items() if k != "LOCKD_LEASE_ID"}
    r = subprocess.run([LOCKCTL, "--url", url, "release", name], capture_output=True, text=True,
                       timeout=30, env=no_id)
    assert r.returncode == EXIT_USAGE and r.stderr.startswith(
        "lockctl: no lease id: LOCKD_LEASE_ID is unset (pass LEASE_ID"), r.stderr
    assert "usage:" not in r.stderr and len(r.stderr.splitlines()) == 1
    r = subprocess.run([LOCKCTL, "--url", url, "release", name], capture_output=True, text=True,
                       timeout=30, env={**no_id, "LOCKD_LEASE_ID": ""})
    assert r.returncode == EXIT_USAGE and "LOCKD_LEASE_ID is empty" in r.stderr, r.stderr
    r = subprocess.run([LOCKCTL, "--url", url, "release", name, "-"], capture_output=True,
                       text=True, timeout=30, input="", env=no_id)
    assert r.returncode == EXIT_USAGE and "stdin" in r.stderr


def test_holders_lists_the_holder_and_the_waiters_owners_in_queue_order(shared_lockd, name):
    """GET /v1/locks/{name} names the waiters (this lockd's, head first); so does
    ``lockctl holders`` (and says "nobody waiting" when nobody is). A failed acquire says what
    to do about it."""
    import threading

    url = shared_lockd.url
    assert lockctl(url, "holders", name).stdout == f"{name}: free; nobody waiting at this lockd\n"
    with LockClient(url) as client:
        lease = client.acquire(name, ttl=30, owner="holder-a")
        assert lockctl(url, "holders", name).stdout == (
            f"{name}: held by 'holder-a' (fence {lease.fence}); nobody waiting at this lockd\n")
        r = lockctl(url, "acquire", name, "--ttl", "5s")  # a failed acquire says what to do
        assert r.returncode == EXIT_NOT_ACQUIRED
        assert r.stderr.strip().endswith("not acquired within 0 s; to wait for it, pass --wait "
                                         "(e.g. --wait 30s)"), r.stderr
        r = lockctl(url, "acquire", name, "--ttl", "5s", "--wait", "100ms")
        assert r.stderr.strip().endswith("; a longer --wait may get it"), r.stderr
        waiting = []
        def wait_then_release(owner: str) -> None:
            client.release(client.acquire(name, ttl=5, wait=20, owner=owner))

        for owner in ("waiter-b", "", "waiter-d"):  # one at a time, so the queue order is known
            thread = threading.Thread(target=wait_then_release, args=(owner,), daemon=True)
            thread.start()
            waiting.append(thread)
            wait_for(lambda n=len(waiting): client.status(name).waiters == n, timeout=10,
                     what=f"{len(waiting)} waiter(s) queued")
        assert client.status(name).waiting_owners == ("waiter-b", "", "waiter-d")
        r = lockctl(url, "--json", "holders", name)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == {"lock": name, "held": True, "fence": lease.fence,
                                        "owner": "holder-a",
                                        "waiting_owners": ["waiter-b", "", "waiter-d"]}
        r = lockctl(url, "holders", name)
        assert r.stdout.splitlines() == [
            f"{name}: held by 'holder-a' (fence {lease.fence}); 3 waiting at this lockd, head first:",
            "  1. 'waiter-b'", "  2. (no owner)", "  3. 'waiter-d'"]
        listed = next(iter(client.locks(name)))
        assert listed.waiters == 3 and listed.waiting_owners is None, "only the one-lock read names them"
        client.release(lease)
        for thread in waiting:  # each is granted in turn and releases at once
            thread.join(timeout=30)
        assert client.status(name).waiting_owners == ()
