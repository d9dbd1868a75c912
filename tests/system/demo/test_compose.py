"""docker-compose.yml and the Dockerfile, tested without a Docker engine (with one, for real:
tests/system/demo/test_compose_real.py).

- The compose file passes the Compose schema (Debian's docker-compose 1.29 validates offline).
- Its wiring (healthchecks, depends_on conditions, one image built from the Dockerfile) is what
  ``docker compose up --abort-on-container-exit demo`` needs from a clean checkout.
- Its services' OWN commands and environments, with the hostnames and ports mapped to this
  machine and a fresh PostgreSQL database in place of the ``postgres`` service, run the whole
  scenario: the demo service exits 0 and its report tells the story.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from graphlib import TopologicalSorter
from pathlib import Path
from typing import Any

import pytest
import yaml
from setuptools import find_packages

from harness import VENV_BIN, ServiceProcess, free_port
from tests.conftest import require
from tests.system.demo.demo_support import assert_story, marked_processes, run_demo

ROOT = Path(__file__).resolve().parents[3]
COMPOSE = ROOT / "docker-compose.yml"
SERVERS = ("lockd", "resource-proxy")  # long-running services of ours, in the image


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def _docker_compose() -> str:
    path = shutil.which("docker-compose")
    require(None if path else "docker-compose not installed (make system-deps)",
            "docker-compose")
    assert path is not None
    return path


def test_compose_file_passes_the_compose_schema(tmp_path):
    exe = _docker_compose()
    ok = subprocess.run([exe, "-f", str(COMPOSE), "config", "-q"], capture_output=True,
                        text=True, timeout=60, cwd=ROOT)
    assert ok.returncode == 0, ok.stderr
    # the validator does validate: the same file with an unknown depends_on condition fails
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE.read_text().replace("service_healthy", "service_ready", 1))
    (tmp_path / "Dockerfile").write_text((ROOT / "Dockerfile").read_text())
    bad = subprocess.run([exe, "-f", str(broken), "config", "-q"], capture_output=True,
                         text=True, timeout=60, cwd=tmp_path)
    assert bad.returncode != 0 and "service_ready" in bad.stderr


def test_compose_wiring(compose):
    services = compose["services"]
    assert set(services) == {"postgres", "lockd", "resource-proxy", "demo"}
    deps = {name: svc.get("depends_on", {}) for name, svc in services.items()}
    # long-form depends_on everywhere, waiting on health, so `up demo` starts in order
    assert deps["lockd"] == {"postgres": {"condition": "service_healthy"}}
    assert deps["resource-proxy"] == {"postgres": {"condition": "service_healthy"},
                                      "lockd": {"condition": "service_healthy"}}
    assert deps["demo"] == {"lockd": {"condition": "service_healthy"},
                            "resource-proxy": {"condition": "service_healthy"}}
    for name in ("postgres", *SERVERS):  # everything waited on has a healthcheck
        assert services[name]["healthcheck"]["test"][0] == "CMD", name
    # no one-shot container: with --abort-on-container-exit its exit would stop everything
    for name in SERVERS + ("demo",):
        svc = services[name]
        assert svc["build"] == "." and svc["image"] == services["demo"]["image"], name
    assert "healthcheck" not in services["demo"]
    assert services["demo"]["command"][:3] == ["python", "-m", "lockd.demo"]


def test_dockerfile_builds_an_image_that_ships_everything_compose_runs(compose):
    lines = [ln.strip() for ln in (ROOT / "Dockerfile").read_text().splitlines()
             if ln.strip() and not ln.lstrip().startswith("#")]
    assert lines[0] == "FROM python:3.11-slim"
    assert any(re.fullmatch(r"RUN pip install (--no-deps )?(\.|/src)( .*)?", ln) for ln in lines)
    copied = " ".join(ln for ln in lines if ln.startswith("COPY"))
    for path in ("pyproject.toml", "README.md", "lockd", "resource_proxy"):
        assert path in copied and (ROOT / path).exists(), path
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    scripts = set(pyproject["project"]["scripts"])
    used = {services_cmd[0] for services_cmd in
            (compose["services"][name]["command"] for name in SERVERS + ("demo",))}
    used |= {"resource-proxy"}  # run through `sh -c … exec resource-proxy serve`
    assert used - {"python", "sh"} <= scripts, f"console scripts missing: {used - scripts}"
    # `pip install .` packages the demo (setuptools discovery as configured in pyproject)
    found = find_packages(str(ROOT), **pyproject["tool"]["setuptools"]["packages"]["find"])
    assert "lockd.demo" in found and "resource_proxy" in found
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored


class Localizer:
    """Maps a container's view onto this machine: service hosts and ports to 127.0.0.1 and free
    ports, the ``postgres`` service's database to a fresh one, container paths to a temp dir."""

    PORTS = {"7070": "lockd", "7071": "resource-proxy"}

    def __init__(self, pg_url: str, workdir: Path):
        self.pg_url = pg_url
        self.workdir = workdir
        self.ports = {name: str(free_port()) for name in self.PORTS.values()}

    def __call__(self, value: Any) -> str:
        text = str(value).replace("$$", "$")  # compose's escape of a literal $
        assert not re.search(r"\$\{?[A-Za-z_]", str(value).replace("$$", "")), \
            f"compose interpolation the test does not model: {value!r}"
        if text.startswith("postgresql"):
            return self.pg_url
        if text in self.PORTS:
            return self.ports[self.PORTS[text]]
        if text == "0.0.0.0":
            return "127.0.0.1"
        text = re.sub(r"\b(?:lockd|resource-proxy|127\.0\.0\.1|localhost):(7070|7071)\b",
                      lambda m: "127.0.0.1:" + self.ports[self.PORTS[m.group(1)]], text)
        return text.replace("/var/lib/lockd", str(self.workdir))

    def env(self, service: dict[str, Any]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LOCKD_", "PROXY_"))}
        env.update({k: self(v) for k, v in (service.get("environment") or {}).items()})
        env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"  # the image's PATH
        return env

    def argv(self, command: list[str]) -> list[str]:
        argv = [self(part) for part in command]
        if argv[0] == "python":
            argv[0] = sys.executable
        return argv


def test_compose_services_run_the_scenario_here(compose, pg_url, tmp_path):
    services = compose["services"]
    local = Localizer(pg_url, tmp_path)
    order = list(TopologicalSorter({n: set(s.get("depends_on", {}))
                                    for n, s in services.items()}).static_order())
    assert order.index("postgres") < order.index("lockd") < order.index("resource-proxy") \
        < order.index("demo")
    started: list[ServiceProcess] = []
    try:
        for name in order:
            if name not in SERVERS:
                continue  # postgres: the fixture's database; demo: run below
            svc = services[name]
            proc = ServiceProcess(local.argv(svc["command"]), env=local.env(svc), cwd=tmp_path,
                                  ready_url=f"http://127.0.0.1:{local.ports[name]}/healthz",
                                  log_path=tmp_path / f"{name}.log")
            started.append(proc.start(timeout=60))
            check = local.argv(svc["healthcheck"]["test"][1:])
            health = subprocess.run(check, env=local.env(svc), capture_output=True, text=True,
                                    timeout=30)
            assert health.returncode == 0, f"{name} healthcheck: {health.stderr}"
        demo = services["demo"]
        argv = local.argv(demo["command"])
        run = run_demo([], tmp_path, argv0=argv, env={k: v for k, v in local.env(demo).items()
                                                      if k == "PATH"})
        assert run.returncode == 0, run.output() + "".join(p.log() for p in started)
        assert_story(run.report)
        assert run.report["mode"] == "external"
        assert run.report["lockd_url"] == f"http://127.0.0.1:{local.ports['lockd']}"
        assert marked_processes(run.marker) == []
    finally:
        stopped = {p.argv[0]: p.stop() for p in reversed(started)}
    assert set(stopped.values()) == {0}, stopped  # SIGTERM, as compose stops them: a clean exit
