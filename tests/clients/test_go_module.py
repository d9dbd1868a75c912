"""The Go client's own tests (``go test ./...`` in clients/go) against a real lockd and proxy,
and the module's hygiene: ``go vet`` and ``gofmt`` clean, no dependency outside the standard
library."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from harness import VENV_BIN
from tests.client.conftest import LockdServer
from tests.clients.conftest import GO_MODULE, go_env


def test_go_test_passes_against_real_servers(go, servers):
    lockd, proxy = servers
    # A lockd of its own whose keys the rotation test rotates (re-read every 100 ms).
    rotating = LockdServer(Path(tempfile.mkdtemp(prefix="lockd-go-rotate-")),
                           env={"LOCKD_KEY_RELOAD_MS": "100"}).start()
    env = {**go_env(), "LOCKD_URL": lockd.url, "PROXY_URL": proxy.url, "CI": "true",
           "ROTATE_LOCKD_URL": rotating.url, "ROTATE_KEY_DIR": str(rotating.key_dir),
           "LOCKD_BIN": str(VENV_BIN / "lockd")}
    try:
        run = subprocess.run([go, "test", "-count=1", "-v", "./..."], cwd=GO_MODULE, env=env,
                             capture_output=True, text=True, timeout=600)
    finally:
        rotating.stop()
        shutil.rmtree(rotating.workdir, ignore_errors=True)
    assert run.returncode == 0, run.stdout + run.stderr
    # Only the TLS test skips here: test_go_tls runs it against https servers.
    assert set(re.findall(r"--- SKIP: (\w+)", run.stdout)) <= {"TestTLSAndMTLS"}, run.stdout
    for name in ("TestStaleWriteIsRefusedWithBothFences", "TestRenewalKeepsTheLeaseAndLossIsSignalled",
                 "TestElectionCampaignProclaimObserveResign", "TestVerifierChecksTokensOffline",
                 "TestVerifierFollowsKeyRotation", "TestObserveResumesAfterADroppedStream",
                 "TestAReadFencesTheLock", "TestA410AtRenewalIsLostAtOnce",
                 "TestALostGrantIsRecoveredByTheRetry", "TestRenewalRidesOutAnOutageShorterThanTheTTL"):
        assert f"--- PASS: {name}" in run.stdout, run.stdout
    assert "ok  \tlockd.dev/lockd\t" in run.stdout, run.stdout


def test_go_vet_and_gofmt_are_clean(go):
    vet = subprocess.run([go, "vet", "./..."], cwd=GO_MODULE, env=go_env(),
                         capture_output=True, text=True, timeout=300)
    assert vet.returncode == 0, vet.stderr
    unformatted = subprocess.run(["gofmt", "-l", "."], cwd=GO_MODULE, capture_output=True,
                                 text=True, timeout=60)
    assert unformatted.returncode == 0 and unformatted.stdout == "", unformatted.stdout


def test_the_module_needs_nothing_but_the_standard_library():
    go_mod = (GO_MODULE / "go.mod").read_text()
    assert "require" not in go_mod, go_mod
    assert not (GO_MODULE / "go.sum").exists()


EXPORTED = re.compile(r"^(?:func (?:\([^)]*\) )?|type |var |const )[A-Z]\w*")


def test_every_exported_name_has_godoc():
    """Each exported top-level func, method, type, var and const of the package (not of its
    commands and examples) is preceded by a doc comment."""
    missing = []
    for path in sorted(GO_MODULE.glob("*.go")):
        if path.name.endswith("_test.go"):
            continue
        lines = path.read_text().splitlines()
        missing += [f"{path.name}:{i + 1}: {line}" for i, line in enumerate(lines)
                    if EXPORTED.match(line) and not (i and lines[i - 1].startswith("//"))]
    assert not missing, missing
