"""``client.acquire_many``: multi-lock leases through the Python client (sync and async), and
the issue's deadlock test (two clients transferring between the same two accounts in opposite
orders) against a real lockd."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from harness import VENV_BIN, run_program, wait_for
from lockd import (
    AcquireTimeout,
    AsyncLockClient,
    AsyncMultiLease,
    LeaseLostError,
    LeaseState,
    LockClient,
    MultiLease,
    ValidationError,
)
from lockd.client.lockctl import EXIT_NOT_ACQUIRED
from lockd.tokens import Verifier


def test_acquire_many_holds_every_lock_renews_and_releases_on_exit(shared_lockd, name):
    a, b = f"{name}/a", f"{name}/b"
    with LockClient(shared_lockd.url, owner="mover") as client:
        ttl = 0.6
        with client.acquire_many([b, a], ttl=ttl, wait=5) as lease:
            assert isinstance(lease, MultiLease)
            assert lease.locks == (a, b) and set(lease.fences) == {a, b}
            assert lease.lease_id.startswith("m.")
            claims = Verifier(client._request("GET", "/v1/keys")).verify(lease.token)
            assert dict(claims.locks) == lease.fences
            # proves: past the TTL (5/3 of it) the renewal monitor keeps the whole set
            time.sleep(ttl * 5 / 3)
            assert lease.state is LeaseState.RENEWED
            for lock in (a, b):
                status = client.status(lock)
                assert status.held and status.owner == "mover"
                assert status.fence == lease.fences[lock]
            assert client.try_acquire(a, ttl=5) is None
            assert client.try_acquire_many([a], ttl=5) is None
            assert lease.renew(ttl=5) is lease and lease.ttl >= 5
        assert lease.state is LeaseState.RELEASED
        assert not client.status(a).held and not client.status(b).held
        again = client.acquire_many([a, b], ttl=5, wait=1)
        assert all(again.fences[n] > lease.fences[n] for n in (a, b))
        again.release()


def test_lost_signal_and_held_errors(shared_lockd, name):
    a, b = f"{name}/a", f"{name}/b"
    lost: list = []
    with LockClient(shared_lockd.url) as client:
        lease = client.acquire_many([a, b], ttl=0.3, auto_renew=False, on_lost=lost.append)
        wait_for(lambda: not client.status(a).held and not client.status(b).held, timeout=5,
                 what="the unrenewed 0.3 s set to lapse")
        with pytest.raises(LeaseLostError):
            lease.renew()
        assert lease.lost.is_set() and lost == [lease] and lease.state is LeaseState.LOST
        holder = client.acquire(b, ttl=5, owner="holder-b")
        with pytest.raises(AcquireTimeout) as info:
            client.acquire_many([a, b], ttl=5, wait=0.2)
        assert info.value.problem["held"][0]["lock"] == b
        assert info.value.problem["held"][0]["owner"] == "holder-b"
        assert b in info.value.detail and "holder-b" in info.value.detail
        assert not client.status(a).held  # nothing granted
        holder.release()
        with pytest.raises(ValidationError):
            client.acquire_many([a, a], ttl=5)
        with pytest.raises(ValidationError):
            client.acquire_many([], ttl=5)


def test_async_acquire_many(shared_lockd, name):
    a, b = f"{name}/a", f"{name}/b"

    async def main() -> None:
        async with AsyncLockClient(shared_lockd.url, owner="async") as client:
            ttl = 0.6
            async with await client.acquire_many([a, b], ttl=ttl, wait=5) as lease:
                assert isinstance(lease, AsyncMultiLease) and lease.locks == (a, b)
                # proves: past the TTL (5/3 of it) the renewal monitor keeps the whole set
                await asyncio.sleep(ttl * 5 / 3)
                assert lease.state is LeaseState.RENEWED
                assert (await client.status(b)).fence == lease.fences[b]
                assert await client.try_acquire_many([b], ttl=5) is None
            assert lease.state is LeaseState.RELEASED
            assert not (await client.status(a)).held

    asyncio.run(main())


def test_two_clients_transferring_in_opposite_orders_never_deadlock(shared_lockd, name):
    """1,000 transfers between two accounts, half taking [A, B] and half [B, A]: every one
    completes, and none waits longer than a transfer plus the TTL."""
    accounts = {f"{name}/acct/1": 1000, f"{name}/acct/2": 1000}
    one, two = list(accounts)
    ttl = 2.0
    inside = threading.Lock()
    waits: list[float] = []
    transfer_times: list[float] = []
    fences: dict[str, list[int]] = {one: [], two: []}
    errors: list[BaseException] = []
    done = [0, 0]

    def worker(index: int, order: list[str]) -> None:
        try:
            with LockClient(shared_lockd.url) as client:
                for _ in range(500):
                    started = time.monotonic()
                    with client.acquire_many(order, ttl=ttl, wait=30, auto_renew=False) as lease:
                        waits.append(time.monotonic() - started)
                        t0 = time.monotonic()
                        assert inside.acquire(blocking=False), "two transfers at once"
                        try:
                            src, dst = order
                            accounts[src] -= 1
                            accounts[dst] += 1
                            for acct in order:
                                fences[acct].append(lease.fences[acct])
                        finally:
                            inside.release()
                        transfer_times.append(time.monotonic() - t0)
                    done[index] += 1
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(0, [one, two])),
               threading.Thread(target=worker, args=(1, [two, one]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[0]
    assert done == [500, 500]
    assert sum(accounts.values()) == 2000 and accounts[one] == accounts[two] == 1000
    assert max(waits) < max(transfer_times) + ttl, max(waits)
    for acct, seen in fences.items():
        assert seen == sorted(seen) and len(set(seen)) == len(seen), acct


def test_lockctl_run_holds_several_locks_for_the_command(shared_lockd, name, tmp_path):
    url = shared_lockd.url
    a, b = f"{name}/a", f"{name}/b"
    out = tmp_path / "env.json"
    # The command records its environment and what lockd says about both locks meanwhile.
    script = ("import json, os, sys, urllib.request as u; "
              "st = {n: json.load(u.urlopen(sys.argv[2] + '/v1/locks/' + n)) "
              "for n in os.environ['LOCKD_LOCKS'].split(',')}; "
              "json.dump({'env': {k: os.environ.get(k) for k in ('LOCKD_LOCKS', 'LOCKD_FENCES', "
              "'LOCKD_TOKEN', 'LOCKD_LOCK')}, 'state': st}, open(sys.argv[1], 'w')); sys.exit(3)")

    def lockctl(*args: str) -> subprocess.CompletedProcess:
        return run_program([str(VENV_BIN / "lockctl"), "--url", url, *args], text=True,
                           timeout=30, env={**os.environ, "LOCKD_LOCK": "inherited"})

    r = lockctl("run", "--lock", b, "--lock", a, "--ttl", "5s", "--owner", "job", "--",
                sys.executable, "-c", script, str(out), url)
    assert r.returncode == 3, r.stderr
    seen = json.loads(out.read_text())
    env, state = seen["env"], seen["state"]
    assert env["LOCKD_LOCKS"] == f"{a},{b}" and env["LOCKD_LOCK"] is None
    fences = json.loads(env["LOCKD_FENCES"])
    claims = Verifier(LockClient(url)._request("GET", "/v1/keys")).verify(env["LOCKD_TOKEN"])
    assert dict(claims.locks) == fences and set(fences) == {a, b}
    for lock in (a, b):
        assert state[lock]["held"] and state[lock]["owner"] == "job"
        assert state[lock]["fence"] == fences[lock]
    with LockClient(url) as client:
        assert not client.status(a).held and not client.status(b).held  # released after
        # One of them held: the command does not start.
        with client.lock(b, ttl=5):
            marker = tmp_path / "ran"
            r = lockctl("run", a, "--lock", b, "--ttl", "2s", "--wait", "200ms", "--",
                        "touch", str(marker))
            assert r.returncode == EXIT_NOT_ACQUIRED and not marker.exists(), r.stderr
            assert not client.status(a).held
    # The single-lock form still works and now also sets LOCKD_LOCKS / LOCKD_FENCES.
    r = lockctl("run", a, "--ttl", "5s", "--", sys.executable, "-c", script, str(out), url)
    assert r.returncode == 3, r.stderr
    env = json.loads(out.read_text())["env"]
    assert env["LOCKD_LOCKS"] == a and env["LOCKD_LOCK"] == a
    assert list(json.loads(env["LOCKD_FENCES"])) == [a]
