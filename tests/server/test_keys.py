"""Key rotation as an operation: ``lockd keys list|rotate|retire`` on the key directory, and a
running lockd picking it up without a restart (``lockd.server.keydir``)."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from harness import wait_for, wait_for_async
from lockd.server.keydir import KeyDirError, list_keys, retire, rotate
from lockd.tokens import KeyRing, Verifier
from tests.server.calls import acquire
from tests.server.conftest import LOCKD


def _states(key_dir, now=None) -> dict[str, str]:
    return {k.kid: k.state for k in list_keys(key_dir, now=now)}


def test_rotate_publishes_at_once_and_signs_after_the_delay(tmp_path):
    clock = [1_800_000_000.0]
    ring = KeyRing.load_or_create(tmp_path, clock=lambda: clock[0])
    old = ring.kid
    new = rotate(tmp_path, publish_delay_s=10, now=clock[0]).kid
    assert ring.reload() is True
    assert set(ring.kids) == {old, new} and ring.kid == old  # published, not signing yet
    assert _states(tmp_path, now=clock[0]) == {old: "signing", new: "pending"}
    clock[0] += 10
    assert ring.kid == new  # switched by time, with no reload
    token = ring.sign("a", 1)
    assert Verifier(ring.jwks()).verify(token).kid == new
    assert _states(tmp_path, now=clock[0]) == {old: "published", new: "signing"}


def test_a_second_rotation_while_one_is_pending_is_refused(tmp_path):
    KeyRing.load_or_create(tmp_path)
    rotate(tmp_path, publish_delay_s=60)
    with pytest.raises(KeyDirError, match="already pending"):
        rotate(tmp_path, publish_delay_s=60)


def test_retire_waits_max_ttl_after_the_key_stopped_signing(tmp_path):
    now = time.time()
    old = KeyRing.load_or_create(tmp_path).kid
    new = rotate(tmp_path, publish_delay_s=5, now=now).kid
    with pytest.raises(KeyDirError, match="signs now"):
        retire(tmp_path, old, max_ttl_ms=1000, now=now)  # still the signer
    with pytest.raises(KeyDirError, match="is pending"):
        retire(tmp_path, new, max_ttl_ms=1000, now=now)
    with pytest.raises(KeyDirError, match="max TTL"):
        retire(tmp_path, old, max_ttl_ms=60_000, now=now + 30)  # 25 s after it stopped
    with pytest.raises(KeyDirError, match="no key 'nope'"):
        retire(tmp_path, "nope", max_ttl_ms=1000, now=now + 100)
    assert retire(tmp_path, old, max_ttl_ms=60_000, now=now + 65.1) == f"retired {old}"
    assert not (tmp_path / f"{old}.pem").exists()
    assert _states(tmp_path, now=now + 66) == {new: "signing", old: "retired"}
    manifest = json.loads((tmp_path / "keys.json").read_text())["keys"]
    assert manifest[old]["retired_at"] == pytest.approx(now + 65.1)


def test_forced_retirement_says_what_may_become_unverifiable(tmp_path):
    now = time.time()
    old = KeyRing.load_or_create(tmp_path).kid
    rotate(tmp_path, publish_delay_s=1, now=now)
    note = retire(tmp_path, old, max_ttl_ms=60_000, force=True, now=now + 11)
    assert note.startswith(f"retired {old} (forced:") and "last 50 s of signing" in note
    ring = KeyRing.load_or_create(tmp_path)
    assert old not in ring.kids


def test_a_ring_keeps_its_keys_when_the_directory_loses_every_key(tmp_path):
    ring = KeyRing.load_or_create(tmp_path)
    kid = ring.kid
    (tmp_path / f"{kid}.pem").unlink()
    with pytest.raises(ValueError, match="no key left"):
        ring.reload()
    assert ring.kid == kid and ring.kids == (kid,)


def test_the_keys_command_lists_rotates_and_retires(tmp_path):
    keys = tmp_path / "keys"
    old = KeyRing.load_or_create(keys).kid

    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([LOCKD, "keys", *args, "--key-dir", str(keys)], capture_output=True,
                              text=True, timeout=60, env={"PATH": "/usr/bin:/bin", **(env or {})})

    rotated = run("rotate", "--publish-delay-ms", "0")
    assert rotated.returncode == 0 and rotated.stdout.startswith("new key "), rotated.stderr
    new = rotated.stdout.split()[2].rstrip(":")
    audit = json.loads(rotated.stderr.strip().removeprefix("audit "))  # the operator's trail
    assert (audit["action"], audit["target"], audit["result"]) == ("key_rotate", new, "ok")
    listed = run("list")
    assert listed.returncode == 0
    rows = {line.split()[0]: line.split()[1] for line in listed.stdout.splitlines()[1:]}
    assert rows == {old: "published", new: "signing"}
    refused = run("retire", old, env={"LOCKD_MAX_TTL_MS": "600000"})
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1
    assert "--force" in refused.stderr and "Traceback" not in refused.stderr
    assert run("retire", new, "--max-ttl-ms", "1").returncode == 1  # the signer
    done = run("retire", old, "--max-ttl-ms", "1")
    assert done.returncode == 0 and done.stdout.strip() == f"retired {old}"
    assert json.loads(done.stderr.strip().removeprefix("audit "))["action"] == "key_retire"
    assert {k.kid: k.state for k in list_keys(keys)} == {new: "signing", old: "retired"}


def test_a_running_lockd_picks_up_rotation_and_retirement(tmp_path, lockd_factory, http):
    keys = tmp_path / "keys"
    old = KeyRing.load_or_create(keys).kid
    server = lockd_factory(f"sqlite:///{tmp_path}/k.db", key_dir=keys,
                           env={"LOCKD_KEY_RELOAD_MS": "100"})
    first = acquire(http, server.url, "rot/a", 60_000).json()
    assert Verifier(http.get(server.url + "/v1/keys").json()).verify(first["token"]).kid == old
    new = rotate(keys, publish_delay_s=1.0).kid
    wait_for(lambda: new in _published(http, server.url), timeout=10, interval=0.05,
             what="the new key to be published")
    signs_from = next(k.signs_from for k in list_keys(keys) if k.kid == new)
    # past signs_from (plus two reload periods): the new key signs grants and renewals
    wait_for(lambda: time.time() > signs_from + 0.2, timeout=10, what="the new key's signs_from")
    renewed = http.post(server.url + "/v1/locks/rot/a/renew",
                        json={"lease_id": first["lease_id"]}).json()
    jwks = http.get(server.url + "/v1/keys").json()
    assert Verifier(jwks).verify(renewed["token"]).kid == new
    assert renewed["fence"] == first["fence"]
    retire(keys, old, max_ttl_ms=1, force=True)
    wait_for(lambda: old not in _published(http, server.url), timeout=10, interval=0.05,
             what="the retired key to leave the published set")
    changes = [json.loads(line.split("audit ", 1)[1]) for line in server.log().splitlines()
               if '"keys_changed"' in line]  # each pick-up is in the running lockd's trail
    assert changes and changes[-1]["target"] == new and old not in changes[-1]["detail"]["published"]


def _published(http, url: str) -> set[str]:
    return {k["kid"] for k in http.get(url + "/v1/keys").json()["keys"]}


def test_a_proxy_drops_a_retired_key_within_the_jwks_max_age():
    """``resource_proxy.jwks.KeySource`` refetches a set older than ``max_age_s`` before it
    verifies, so a retired key stops verifying (cached tokens too) within that bound; while
    lockd does not answer it keeps the set and retries in the background."""
    import asyncio

    from resource_proxy.errors import InvalidTokenError
    from resource_proxy.jwks import KeySource

    old, new = KeyRing.generate(), KeyRing.generate()
    served = {"keys": old.jwks()["keys"] + new.jwks()["keys"]}
    now = [0.0]
    lockd = ["up"]

    async def load():
        if lockd[0] == "refusing":
            raise OSError("connection refused")
        if lockd[0] == "hanging":
            await asyncio.Event().wait()  # never answers (until cancelled)
        return served

    async def run() -> None:
        keys = KeySource(load, max_age_s=60, clock=lambda: now[0])
        await keys.reload(force=True)
        token = old.sign("a", 1)
        assert (await keys.verify(token)).kid == old.kid  # verified, now cached
        served["keys"] = new.jwks()["keys"]  # lockd retired the old key
        now[0] += 59
        assert (await keys.verify(token)).kid == old.kid  # within max-age: still the old set
        now[0] += 1
        with pytest.raises(InvalidTokenError):
            await keys.verify(token)
        fresh = new.sign("a", 2)
        assert (await keys.verify(fresh)).kid == new.kid
        assert keys.loads == 2
        lockd[0] = "refusing"
        now[0] += 60
        assert (await keys.verify(fresh)).kid == new.kid  # the set is kept
        assert keys.available is False and keys.loads == 3
        lockd[0] = "hanging"
        now[0] += 2
        claims = await asyncio.wait_for(keys.verify(fresh), timeout=1)  # nobody waits
        assert claims.kid == new.kid
        # the retry runs in the background
        await wait_for_async(lambda: keys.loads == 4, timeout=5, what="the background reload")
        keys._background.cancel()

    asyncio.run(run())


def test_a_kid_that_begins_with_a_dash_is_retired_by_name(tmp_path):
    """One thumbprint in 64 begins with '-', which argparse takes for an option."""
    keys = next(d for d in (tmp_path / f"k{i}" for i in range(2000))
                if KeyRing.load_or_create(d).kid.startswith("-"))
    old = KeyRing.load_or_create(keys).kid
    new = rotate(keys, publish_delay_s=0).kid

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([LOCKD, "keys", *args], capture_output=True, text=True,
                              timeout=60, env={"PATH": "/usr/bin:/bin"})

    done = run("retire", old, "--key-dir", str(keys), "--max-ttl-ms", "1")
    assert done.returncode == 0 and done.stdout.strip() == f"retired {old}", done.stderr
    assert _states(keys) == {new: "signing", old: "retired"}
    assert run("retire", "--key-dir", str(keys)).returncode == 2  # no KID: a usage error
