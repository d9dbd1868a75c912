"""docker-compose.yml and the Dockerfile for real: a Docker engine builds the image and
``docker-compose up`` runs the revived-holder demo in containers.

- The engine: the running one, else ``dockerd`` started here and stopped afterwards
  (tests/system/demo/docker_support.py). Not installed: skipped. Installed but it cannot be started:
  skipped, or a failure under CI=true.
- The base images: tests/system/demo/compose_images.sh pulls them, or (no registry reachable) makes
  stand-ins from Debian packages once and keeps them in the engine for the next run.
- docker-compose.yml plus tests/system/demo/compose.test.yml (host-network build, nothing else):
  ``up --build --abort-on-container-exit --exit-code-from demo demo`` exits 0 and the demo's log
  shows scene 3's revived holder REJECTED with a stale fence one below the highest; ``stop`` ends every
  server cleanly on SIGTERM; ``down -v`` leaves no container, network or volume of the project.
- The image as a user sees it: ``lockd --help``, an unprivileged user, ``lockd serve`` answering
  /healthz on a published port, no compiler or cache in it, and its size (printed).

Timings and the size go to the terminal (``compose:`` lines). On our 2-core machines, dockerd on
overlay2: first run 2–5 min (stand-ins 80–240 s with the load, ``up --build`` 30–50 s); with the
images cached ~45 s (``up`` ~20 s).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harness import wait_for
from tests.conftest import IN_CI
from tests.system.demo import docker_support
from tests.system.demo.docker_support import (
    Dockerd,
    DockerMissing,
    DockerUnavailable,
    ensure_dockerd,
)

ROOT = Path(__file__).resolve().parents[3]
COMPOSE = ROOT / "docker-compose.yml"
OVERRIDE = ROOT / "tests/system/demo/compose.test.yml"
BASE_IMAGES = ROOT / "tests/system/demo/compose_images.sh"
IMAGE = "lockd-demo:latest"
BASE = "python:3.11-slim"
MAX_ADDED_MB = 150  # what our layers may add to the base image: deps ~100 MB, our code < 1 MB

pytestmark = pytest.mark.timeout(1200)  # a first run with stand-ins: 2–5 min


def say(capsys: pytest.CaptureFixture[str], line: str) -> None:
    with capsys.disabled():
        print(f"\ncompose: {line}", flush=True)


def run(argv: list[str], timeout: float = 120, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"Docker is installed but unusable under CI=true: {reason}")
    pytest.skip(f"Docker unavailable: {reason}")


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Iterator[Dockerd]:
    try:
        engine = ensure_dockerd(tmp_path_factory.mktemp("dockerd") / "dockerd.log")
    except DockerMissing as exc:
        pytest.skip(str(exc))
    except DockerUnavailable as exc:
        _unavailable(str(exc))
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def base_images(engine: Dockerd) -> float:
    """The base images are there (real or stand-ins); seconds it took."""
    started = time.monotonic()
    made = run(["bash", str(BASE_IMAGES)], timeout=900, cwd=ROOT)
    if made.returncode != 0:
        _unavailable(f"compose_images.sh exit {made.returncode}:\n{made.stderr[-3000:]}")
    return time.monotonic() - started


def compose_env() -> dict[str, str]:
    env = dict(os.environ)
    # docker-compose 1.29 builds with the classic builder through the API: no buildx needed
    env["COMPOSE_DOCKER_CLI_BUILD"] = "0"
    env.pop("DOCKER_BUILDKIT", None)
    return env


class Project:
    """One compose project (its own name: its own containers, network and volumes)."""

    def __init__(self, engine: Dockerd, name: str):
        self.engine, self.name = engine, name
        self.base = [engine.compose, "-p", name, "-f", str(COMPOSE), "-f", str(OVERRIDE)]

    def compose(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return run([*self.base, *args], timeout=timeout, cwd=ROOT, env=compose_env())

    def docker(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return run([self.engine.docker, *args], timeout=timeout)

    def leftovers(self, kind: str) -> list[str]:
        """Containers/networks/volumes still labelled as this project's."""
        sub = ["ps", "-a"] if kind == "container" else [kind, "ls"]
        out = self.docker(*sub, "-q", "--filter", f"label=com.docker.compose.project={self.name}")
        return out.stdout.split()

    def down(self) -> subprocess.CompletedProcess[str]:
        return self.compose("down", "-v", "--remove-orphans", "-t", "10")


@pytest.fixture
def project(engine: Dockerd) -> Iterator[Project]:
    proj = Project(engine, "lockdtest")
    proj.down()  # what a run killed half-way left running
    yield proj
    proj.down()
    for net in proj.leftovers("network"):
        proj.docker("network", "rm", net)


@pytest.fixture(scope="module")
def image(engine: Dockerd, base_images: float) -> str:
    """lockd-demo built by compose (a cache hit after the compose test)."""
    proj = Project(engine, "lockdtestbuild")
    built = proj.compose("build", "lockd", timeout=900)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return IMAGE


# The demo's rows are all governed by the table's one lock (one row, one lock), so the three scenes
# share one fence sequence: scene 3's revived holder A presents a fence one below B's.
REJECTED = re.compile(r"\bA\s+(\d+)\s+409 stale_token\s+write step \d+ REJECTED: "
                      r"stale fence (\d+) < highest (\d+)\b")


def test_compose_up_runs_the_demo_in_containers(project, base_images, capsys):
    say(capsys, f"base images ready in {base_images:.0f} s (tests/system/demo/compose_images.sh)")
    started = time.monotonic()
    up = project.compose("up", "--build", "--abort-on-container-exit", "--exit-code-from",
                         "demo", "demo", timeout=1200)
    took = time.monotonic() - started
    log = project.compose("logs", "--no-color", "demo").stdout
    assert up.returncode == 0, f"exit {up.returncode}\n{up.stdout[-6000:]}\n{up.stderr[-3000:]}"
    say(capsys, f"up --build ... demo: exit 0 in {took:.0f} s")

    # the demo's own container log tells scene 3: the revived holder's write is refused
    rejected = REJECTED.search(log)
    assert rejected, log[-4000:]
    held, stale, highest = (int(g) for g in rejected.groups())
    assert held == stale and stale < highest, rejected.group(0)
    assert (f"A's write after waking is rejected: 409 stale_token: presented {stale}, "
            f"highest {highest}") in log
    assert "=> scene 3 passed" in log
    assert "PASSED: scene 1 ok, scene 2 ok, scene 3 ok" in log

    # `up demo` leaves its dependencies running; stopping them is SIGTERM (postgres: SIGINT),
    # and each must exit cleanly by itself, not be SIGKILLed after the 10 s grace period
    servers = {}
    for svc in ("postgres", "lockd", "resource-proxy"):
        ids = project.compose("ps", "-q", svc).stdout.split()
        assert len(ids) == 1, (svc, ids)
        servers[svc] = ids[0]
        state = project.docker("inspect", "-f", "{{.State.Status}}", ids[0]).stdout.strip()
        assert state == "running", (svc, state)
    started = time.monotonic()
    stop = project.compose("stop", "-t", "10")
    stop_took = time.monotonic() - started
    assert stop.returncode == 0, stop.stderr
    for svc, cid in servers.items():
        code = project.docker("inspect", "-f", "{{.State.ExitCode}}", cid).stdout.strip()
        assert code == "0", f"{svc} exit {code}:\n" + project.compose("logs", svc).stdout[-3000:]
    assert stop_took < 8, f"stop took {stop_took:.1f} s: someone waited for the kill"

    down = project.down()
    assert down.returncode == 0, down.stderr
    for kind in ("container", "network", "volume"):
        assert project.leftovers(kind) == [], kind
    say(capsys, f"stop {stop_took:.1f} s (all exit 0), down -v: no container/network/volume left")


def test_image_as_a_user_runs_it(engine, image, capsys):
    docker = engine.docker
    helped = run([docker, "run", "--rm", image, "lockd", "--help"])
    assert helped.returncode == 0 and "serve" in helped.stdout, helped.stderr

    user = run([docker, "run", "--rm", image, "sh", "-c", 'echo "$(id -u) $(id -un)"'])
    uid, name = user.stdout.split()
    assert uid != "0" and name == "lockd", user.stdout

    # nothing to build with and nothing left over from building
    found = run([docker, "run", "--rm", "-u", "0", image, "sh", "-c",
                 "for c in gcc cc c++ make; do command -v $c; done; "
                 "ls -d /src /root/.cache /var/lib/lockd/.cache /tmp/pip-* 2>/dev/null; true"])
    assert found.returncode == 0 and found.stdout.split() == [], found.stdout

    # the image's own command: `lockd serve` on 0.0.0.0:7070, published on a loopback port
    cid = run([docker, "run", "-d", "-p", "127.0.0.1::7070", image]).stdout.strip()
    assert cid
    try:
        port = run([docker, "port", cid, "7070/tcp"]).stdout.split()[0].rsplit(":", 1)[1]

        def healthy():
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
            except httpx.HTTPError:
                return None

        resp = wait_for(healthy, timeout=60, interval=0.5, what="lockd /healthz in the container")
        assert resp.status_code == 200 and resp.json() == {"status": "ok", "server": "lockd"}
        stopped = run([docker, "stop", "-t", "10", cid])
        assert stopped.returncode == 0
        code = run([docker, "inspect", "-f", "{{.State.ExitCode}}", cid]).stdout.strip()
        assert code == "0", run([docker, "logs", cid]).stderr[-3000:]
    finally:
        run([docker, "rm", "-f", "-v", cid])

    sizes = run([docker, "image", "inspect", "-f", "{{.Size}}", image, BASE]).stdout.split()
    size, base = (int(s) / 1e6 for s in sizes)
    say(capsys, f"image {image}: {size:.0f} MB ({size - base:.0f} MB over {BASE}, {base:.0f} MB)")
    assert size - base < MAX_ADDED_MB


def test_base_images_script_keeps_real_images_and_reuses_its_stand_ins(engine, base_images,
                                                                      tmp_path):
    docker = engine.docker
    # a "real" image (no stand-in label) under the python name: left alone, not pulled over
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "marker").write_text("real\n")
    real = "lockdtest/real-python:1"
    tar = subprocess.Popen(["tar", "-C", str(tmp_path / "root"), "-c", "."],
                           stdout=subprocess.PIPE)
    imported = run([docker, "import", "-", real], stdin=tar.stdout)
    tar.wait()
    assert imported.returncode == 0, imported.stderr
    try:
        before = run([docker, "image", "inspect", "-f", "{{.Id}}", real]).stdout
        env = {**os.environ, "COMPOSE_IMAGES_PYTHON": real}
        again = run(["bash", str(BASE_IMAGES)], timeout=120, cwd=ROOT, env=env)
        assert again.returncode == 0, again.stderr
        assert f"{real}: present (not a stand-in), left alone" in again.stderr
        assert run([docker, "image", "inspect", "-f", "{{.Id}}", real]).stdout == before
        # postgres: the stand-in made for the compose test (or a real image) is reused as it is
        assert re.search(r"postgres:16-alpine: (stand-in cached|pulled|present)", again.stderr)
        assert "building" not in again.stderr, again.stderr
    finally:
        run([docker, "rmi", real])


# --- when there is no engine: what the fixture skips on, or fails on under CI=true -------------

def test_missing_docker_tools_are_reported_as_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no docker client, no docker-compose
    monkeypatch.setattr(docker_support.shutil, "which",
                        lambda name, path=None: "/usr/sbin/dockerd" if name == "dockerd" else None)
    with pytest.raises(DockerMissing, match="docker, docker-compose not installed"):
        ensure_dockerd(tmp_path / "dockerd.log")


def test_a_dockerd_that_cannot_start_is_unavailable_with_its_log(tmp_path, monkeypatch):
    engine_tools = [docker_support._which(n) for n in ("docker", "dockerd", "docker-compose")]
    if None in engine_tools or os.geteuid() != 0:
        pytest.skip("needs docker, dockerd and docker-compose installed, and root")
    # no daemon answers on this socket, and this dockerd refuses its flags at once
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/none.sock")
    monkeypatch.setenv("LOCKD_TEST_DOCKERD_ARGS", "--no-such-flag")
    with pytest.raises(DockerUnavailable, match=r"(?s)did not start \(exit \d+\).*no-such-flag"):
        ensure_dockerd(tmp_path / "dockerd.log", timeout=30)
