"""The README's Quick start, then its Python example, then its stop line: run as written, in
order, three times in one fresh clone, as a reader pasting them would: the first two passes
command by command with each exit status checked (so a step that only works once fails the
second), the third the blocks pasted verbatim into one shell.

The clone is ``git clone`` of this checkout; it reuses this checkout's ``.venv`` (a symlink, with
the clone's ``pyproject.toml`` dated before the venv's install stamp, so ``make install`` has
nothing to do) instead of installing again. The commands are the lines of the Quick start's bash
block (the block a reader pastes), the Python example is the python block of "The Python
client" (run with the venv's ``python``, as the README says) and the stop line is that section's
bash block, all read from the README under test, so editing them edits this test. The README's
own lines wait for the servers. Each pass is a new bash (a new terminal); a later one finds the
earlier ones' ``lockd.db``, ``resource.db`` and fences, and must pass all the same.
docs/getting-started.md shows the same Quick start: it must be the README's.
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

from sybil import Document
from sybil.parsers.markdown.lexers import FencedCodeBlockLexer

from harness import free_port
from tests.system.readme.support import LOCKD_ADDRESS, PROXY_ADDRESS, README, ROOT, ported

GETTING_STARTED = ROOT / "docs" / "getting-started.md"


def section(text: str, title: str) -> str:
    """The text under ``## title`` up to the next ``## `` heading."""
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def blocks(text: str, language: str) -> list[str]:
    return [str(r.lexemes["source"]) for r in FencedCodeBlockLexer(language)(Document(text, "qs"))]


def script_commands(source: str) -> list[str]:
    """The commands of a bash block, as a shell reads them when it is pasted: one a line, a line
    ending in ``\\`` going on on the next; blank lines and ``#`` comment lines left out."""
    commands: list[str] = []
    continued = False
    for line in source.splitlines():
        if continued:
            commands[-1] += "\n" + line
        elif line.strip() and not line.lstrip().startswith("#"):
            commands.append(line)
        else:
            continue
        continued = line.endswith("\\")
    return commands


def quick_start_commands(text: str) -> list[str]:
    """The commands of the one bash block under '## Quick start'."""
    found = blocks(section(text, "Quick start"), "bash")
    assert len(found) == 1, "the Quick start has one bash block"
    return script_commands(found[0])


def python_example(text: str) -> tuple[str, list[str]]:
    """The Python client section's python block, and its bash block's commands (the stop)."""
    client = section(text, "The Python client")
    (source,) = blocks(client, "python")
    (stop,) = blocks(client, "bash")
    return source, script_commands(stop)


def harness(commands: list[str], python: str, stop: list[str]) -> tuple[str, int]:
    """A bash script (each command, its exit status checked; the Python example; the stop) and
    how many steps it has."""
    steps = [*commands, f"python - <<'__README_PY__'\n{python}__README_PY__", *stop]
    out = ["trap 'kill $(jobs -p) 2>/dev/null' EXIT"]
    for i, cmd in enumerate(steps):
        out.append(f"echo '::run {i}'")
        out.append(cmd)
        out.append(f"__rc=$?; echo; echo \"::rc {i} $__rc\"; [ $__rc -eq 0 ] || exit 1")
    out.append("for job in $(jobs -p); do wait $job; echo \"::server-exit $?\"; done")
    out.append("trap - EXIT")
    return "\n".join(out) + "\n", len(steps)


def paste(text: str, python: str) -> str:
    """The Quick start's block, the Python example and the stop line as a reader pastes them into
    one shell, then a wait for the servers' exit statuses."""
    (quick_start,) = blocks(section(text, "Quick start"), "bash")
    (stop,) = blocks(section(text, "The Python client"), "bash")
    return (f"{quick_start}python - <<'__README_PY__'\n{python}__README_PY__\n{stop}"
            "for job in $(jobs -p); do wait $job; echo \"::server-exit $?\"; done\n")


def test_getting_started_shows_the_readme_quick_start():
    readme = blocks(section(README.read_text(), "Quick start"), "bash")
    page = blocks(section(GETTING_STARTED.read_text(), "Quick start"), "bash")
    assert readme
    assert page == readme, "docs/getting-started.md's Quick start differs from the README's"


def test_quick_start_and_python_example_rerun_in_a_fresh_clone(tmp_path: Path):
    text = README.read_text()
    commands = quick_start_commands(text)
    python, stop = python_example(text)
    assert commands[0].startswith("make install") and any(c.startswith("lockd serve") for c in commands)
    assert stop and all(c.startswith("kill ") for c in stop)
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=60)
    venv = Path(sys.prefix)
    stamp = venv / ".installed"
    assert stamp.exists(), f"{stamp} missing: run `make install` first"
    (clone / ".venv").symlink_to(venv)
    before = stamp.stat().st_mtime - 60
    os.utime(clone / "pyproject.toml", (before, before))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOCKD_", "PROXY_"))}
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not p.startswith(str(venv)))
    # the servers on free ports, never the documented 7070/7071 (a reader's Quick start may be
    # running there): the addresses in the text are replaced, `lockd serve` and
    # `resource-proxy serve` take their port from the environment, lockctl its URL
    lockd_port, proxy_port = free_port(), free_port()
    ports = {LOCKD_ADDRESS: f"127.0.0.1:{lockd_port}", PROXY_ADDRESS: f"127.0.0.1:{proxy_port}"}
    env.update(LOCKD_PORT=str(lockd_port), PROXY_PORT=str(proxy_port),
               LOCKD_URL=f"http://127.0.0.1:{lockd_port}")
    commands = [ported(c, ports) for c in commands]
    python, stop = ported(python, ports), [ported(c, ports) for c in stop]
    script, steps = harness(commands, python, stop)
    pasted = ported(paste(text, python), ports)
    fences = []
    for attempt in (1, 2, 3):
        if attempt < 3:  # command by command, each exit status checked
            done = subprocess.run(["bash", "-c", script], cwd=clone, env=env,
                                  capture_output=True, text=True, timeout=180)
        else:  # the blocks pasted verbatim into one shell reading them line by line
            done = subprocess.run(["bash", "-s"], input=pasted, cwd=clone, env=env,
                                  capture_output=True, text=True, timeout=180)
        log = f"pass {attempt}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
        assert done.returncode == 0, log
        if attempt < 3:
            statuses = re.findall(r"^::rc (\d+) (\d+)$", done.stdout, re.MULTILINE)
            assert statuses == [(str(i), "0") for i in range(steps)], log
        assert "lockctl:" not in done.stderr and "Traceback" not in done.stderr, log
        assert re.findall(r"^::server-exit (\d+)$", done.stdout, re.MULTILINE) == ["0", "0"], log
        fence = re.search(r"^working under fence (\d+)$", done.stdout, re.MULTILINE)
        assert fence, log
        fences.append(int(fence[1]))
        assert '"code":"stale_token"' in done.stdout and "A's old token was refused" in done.stdout, log
        assert done.stdout.count(" HTTP 200") == 2, log
        assert re.search(r"^accounts: fence \d+, balance 20\.00$", done.stdout, re.MULTILINE), log
        with sqlite3.connect(clone / "resource.db") as db:
            assert db.execute("SELECT id, balance FROM accounts").fetchall() == [(1, "20.00")], log
    assert fences[0] < fences[1] < fences[2], "lockd.db keeps the fences of the earlier passes"
