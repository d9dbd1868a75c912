"""The forking starter (harness/zygote.py) starts the same program an exec would: the same
argv, working directory, environment, session and exit status, a real pid for real signals,
and nothing shared between two children but the imports."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from harness import VENV_BIN, ServiceProcess, free_port, run_program, wait_for, zygote
from harness.servers import LockdServer

PROBE = textwrap.dedent("""
    import json, os, random, signal, sys
    out = {"argv": sys.argv, "cwd": os.getcwd(), "env": os.environ.get("PROBE_VALUE"),
           "absent": os.environ.get("PROBE_ABSENT"), "leader": os.getsid(0) == os.getpid(),
           "path0": sys.path[0], "random": random.random(), "main": __name__,
           "stdin": sys.stdin.read(), "sigterm": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL}
    print(json.dumps(out), flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    mode = sys.argv[1]
    if mode == "wait":
        signal.pause()  # until a signal ends it
    sys.exit(int(mode))
""")


@pytest.fixture
def probe(tmp_path: Path) -> Path:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    return script


def _start(argv, tmp_path: Path, name: str, *, fork: bool, env=None):
    env = {**os.environ, "PROBE_VALUE": "seen", **(env or {})}
    env.pop("PROBE_ABSENT", None)
    log = tmp_path / f"{name}.log"
    if fork:
        assert zygote.supports(argv, env)
        return zygote.spawn(argv, env=env, cwd=tmp_path, log_path=log), log
    with open(log, "ab") as out:
        return subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True), log


def _report(log: Path) -> dict:
    lines = log.read_text().splitlines()
    assert lines[1] == "to stderr"  # both streams go to the log
    return json.loads(lines[0])


def test_a_forked_child_sees_what_an_exec_would(probe: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("PROBE_ABSENT", "only in the test process")
    argv = [sys.executable, str(probe), "3"]
    forked, forked_log = _start(argv, tmp_path, "forked", fork=True)
    execd, execd_log = _start(argv, tmp_path, "execd", fork=False)
    assert forked.wait(30) == 3 and execd.wait(30) == 3
    seen, expected = _report(forked_log), _report(execd_log)
    assert seen.pop("random") != expected.pop("random")
    assert seen == expected
    assert seen["absent"] is None and seen["leader"] and seen["main"] == "__main__"


def test_two_forked_children_draw_different_random_numbers(probe: Path, tmp_path: Path):
    argv = [sys.executable, str(probe), "0"]
    runs = [_start(argv, tmp_path, f"r{i}", fork=True) for i in range(2)]
    assert [child.wait(30) for child, _ in runs] == [0, 0]
    assert _report(runs[0][1])["random"] != _report(runs[1][1])["random"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_signal_reaches_the_child_and_its_status_comes_back(probe: Path, tmp_path: Path, sig):
    child, log = _start([sys.executable, str(probe), "wait"], tmp_path, "sig", fork=True)
    wait_for(lambda: log.exists() and "to stderr" in log.read_text(), what="the probe's output")
    assert child.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(0.05)
    os.kill(child.pid, sig)
    assert child.wait(10) == -sig and child.poll() == -sig


def test_an_exited_childs_pid_stays_taken_until_its_exit_is_read(probe: Path, tmp_path: Path):
    """As with ``Popen``: a late signal to an exited child's pid can never reach a process that
    reused the pid, because the pid is not free before ``poll()``/``wait()`` has read the exit."""
    child, log = _start([sys.executable, str(probe), "wait"], tmp_path, "zombie", fork=True)
    wait_for(lambda: log.exists() and "to stderr" in log.read_text(), what="the probe's output")
    os.kill(child.pid, signal.SIGKILL)
    def state() -> str:
        return Path(f"/proc/{child.pid}/stat").read_text().rpartition(")")[2].split()[0]

    readable, _, _ = select.select([child._sock], [], [], 10)
    assert readable, "the zygote reports the exit"
    assert state() == "Z"  # reported, and still held
    assert child.wait(10) == -signal.SIGKILL
    wait_for(lambda: not Path(f"/proc/{child.pid}").exists(), what="the zombie to be reaped")


def test_lockd_forked_by_the_zygote_serves_pauses_and_stops_cleanly(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("HARNESS_ZYGOTE", "1")
    server = LockdServer(f"sqlite:///{tmp_path}/z.db", log_dir=tmp_path).start()
    try:
        assert isinstance(server.proc.proc, zygote.ZygoteChild)
        assert Path(f"/proc/{server.pid}/comm").read_text().strip() == "lockd"
        got = httpx.post(f"{server.url}/v1/locks/z/acquire", json={"ttl_ms": 5000})
        assert got.status_code == 200, got.text
        server.pause()
        with pytest.raises(httpx.TimeoutException):
            httpx.get(server.url + "/healthz", timeout=0.3)
        server.resume()
        assert httpx.get(server.url + "/healthz").status_code == 200
    finally:
        assert server.stop() == 0
    assert "Application shutdown complete" in server.log()


def test_a_start_that_fails_reports_its_output(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("HARNESS_ZYGOTE", "1")
    port = free_port()
    proc = ServiceProcess([str(VENV_BIN / "lockd"), "serve", "--store", "nonsense://x",
                           "--port", str(port)], ready_url=f"http://127.0.0.1:{port}/healthz",
                          cwd=tmp_path, log_path=tmp_path / "bad.log")
    with pytest.raises(RuntimeError, match="exited with 2"):
        proc.start(timeout=20)
    assert "nonsense" in proc.log()


def test_what_the_zygote_cannot_reproduce_is_left_to_exec(tmp_path: Path):
    env = dict(os.environ)
    lockd = str(VENV_BIN / "lockd")
    assert zygote.supports([lockd, "serve"], env)
    assert zygote.supports([sys.executable, "-m", "chaos", "--help"], env)
    assert not zygote.supports(["faketime", "-f", "+1h", lockd, "serve"], env)
    assert not zygote.supports(["/bin/true"], env)
    assert not zygote.supports([sys.executable, "-c", "print(1)"], env)
    assert not zygote.supports([lockd, "serve"], {**env, "PYTHONHASHSEED": "1"})
    assert not zygote.supports([lockd, "serve"], {**env, "LD_PRELOAD": "/x.so"})


def test_the_zygote_exits_with_the_process_that_started_it(tmp_path: Path):
    starter = subprocess.run(
        [sys.executable, "-c", "from harness import zygote; zygote._socket_path(); "
                               "print(zygote._zygote[0].pid)"],
        cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True, timeout=60)
    assert starter.returncode == 0, starter.stderr
    pid = int(starter.stdout)
    wait_for(lambda: not zygote._alive(pid), timeout=10, what="the orphaned zygote to exit")


def test_run_program_is_subprocess_run_with_captured_output(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("HARNESS_ZYGOTE", "1")
    script = tmp_path / "echo.py"
    script.write_text("import sys\ndata = sys.stdin.read()\nprint(data.upper())\n"
                      "print('seekable', sys.stdin.seekable(), file=sys.stderr)\nsys.exit(4)\n")
    argv = [sys.executable, str(script)]
    forked = run_program(argv, input="piped", text=True, timeout=30)
    plain = subprocess.run(argv, input="piped", text=True, timeout=30, capture_output=True)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        plain.returncode, plain.stdout, plain.stderr) == (4, "PIPED\n", "seekable False\n")


def test_run_program_kills_what_outlives_its_timeout(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("HARNESS_ZYGOTE", "1")
    script = tmp_path / "hang.py"
    script.write_text("import signal\nsignal.pause()\n")
    with pytest.raises(subprocess.TimeoutExpired):
        run_program([sys.executable, str(script)], timeout=1)
