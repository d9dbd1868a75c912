"""Concurrent key operations on one key directory: ``lockd keys rotate`` run by two processes at
the same instant. Rotations are serialized on the directory, so exactly one adds a key, the other
is refused in one line, and no key ever signs before its publish delay has passed."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from lockd.server.keydir import KeyDirError, list_keys, locked
from lockd.tokens import KeyRing, read_key_dir, thumbprint

DELAY_MS = 60_000
ROUNDS = 8

# A real ``lockd keys rotate`` (the CLI's own entry point) that first spins until the shared
# start time, so both processes enter the rotation within microseconds of each other.
_AT = """
import sys, time
from lockd.server.cli import main
start = float(sys.argv[1])
while time.time() < start:
    pass
sys.exit(main(sys.argv[2:]))
"""


def _race(key_dir, n: int = 2) -> list[subprocess.CompletedProcess]:
    start = time.time() + 1.5  # after both interpreters have imported lockd
    procs = [subprocess.Popen([sys.executable, "-c", _AT, repr(start), "keys", "rotate",
                               "--key-dir", str(key_dir), "--publish-delay-ms", str(DELAY_MS)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(n)]
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def test_two_concurrent_rotations_add_one_key_and_keep_the_publish_delay(tmp_path):
    for round_ in range(ROUNDS):
        keys = tmp_path / f"keys-{round_}"
        old = KeyRing.load_or_create(keys).kid
        before = time.time()
        results = _race(keys)
        codes = sorted(r.returncode for r in results)
        assert codes == [0, 1], [(r.returncode, r.stdout, r.stderr) for r in results]
        refused = next(r for r in results if r.returncode == 1)
        line = refused.stderr.strip()
        assert line.count("\n") == 0 and "already pending" in line and "Traceback" not in line
        new = next(r for r in results if r.returncode == 0).stdout.split()[2].rstrip(":")
        # one new key, recorded in the manifest, and it does not sign before the delay
        assert {k.kid: k.state for k in list_keys(keys)} == {old: "signing", new: "pending"}
        manifest = json.loads((keys / "keys.json").read_text())["keys"]
        for signs_from, key in read_key_dir(keys):
            kid = thumbprint(key.public_key())
            if kid != old:
                assert manifest[kid]["signs_from"] == signs_from
                assert signs_from >= before + DELAY_MS / 1000
        assert [thumbprint(k.public_key()) for _, k in read_key_dir(keys)] == [old, new]


def test_a_key_operation_gives_up_clearly_while_another_holds_the_directory(tmp_path):
    KeyRing.load_or_create(tmp_path)
    with locked(tmp_path), pytest.raises(KeyDirError, match="another key operation"):
        with locked(tmp_path, wait_s=0.1):
            pass
    with locked(tmp_path, wait_s=0.1):  # free again once the first is done
        pass
