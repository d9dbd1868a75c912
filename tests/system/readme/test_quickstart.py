"""The README's Quick start, run as written, in order, in a fresh clone (issue 18).

The clone is ``git clone`` of this checkout; it reuses this checkout's ``.venv`` (a symlink, with
the clone's ``pyproject.toml`` dated before the venv's install stamp, so ``make install`` has
nothing to do) instead of installing again. The commands are the ``$ `` lines of the section's
console block, read from the README under test, so editing them edits this test. Each runs in
one bash session and must exit 0; after a command that starts a server in the background the
harness waits for its ``/healthz``, as a person waits for the ready line.
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

from tests.system.readme.support import (
    LOCKD_URL,
    PROXY_URL,
    README,
    ROOT,
    console_commands,
    readme_ports,
)

READY = {"lockd serve": LOCKD_URL, "resource-proxy serve": PROXY_URL}


def quick_start_commands(text: str) -> list[str]:
    """The commands of the one console block under '## Quick start'."""
    section = text.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    blocks = [r.lexemes["source"] for r in FencedCodeBlockLexer("console")(Document(section, "qs"))]
    assert len(blocks) == 1, "the Quick start has one console block"
    return console_commands(str(blocks[0]))


def harness(commands: list[str]) -> str:
    """A bash script: each command, its exit status checked, servers waited for."""
    out = ["trap 'kill $(jobs -p) 2>/dev/null' EXIT"]
    for i, cmd in enumerate(commands):
        out.append(f"echo '::run {i}'")
        out.append(cmd)
        out.append(f"__rc=$?; echo; echo \"::rc {i} $__rc\"; [ $__rc -eq 0 ] || exit 1")
        for prefix, url in READY.items():
            if cmd.startswith(prefix) and re.search(r"&\s*(#.*)?$", cmd):
                out.append(f"for _ in $(seq 200); do curl -sf {url}/healthz >/dev/null && break; "
                           f"sleep 0.1; done; curl -sf {url}/healthz >/dev/null || "
                           f"{{ echo '::not ready {url}'; exit 1; }}")
    out.append("for job in $(jobs -p); do wait $job; echo \"::server-exit $?\"; done")
    out.append("trap - EXIT")
    return "\n".join(out) + "\n"


def test_quick_start_runs_as_written_from_a_fresh_clone(tmp_path: Path):
    commands = quick_start_commands(README.read_text())
    assert commands[0].startswith("make install") and any(c.startswith("lockd serve") for c in commands)
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
    with readme_ports():
        done = subprocess.run(["bash", "-c", harness(commands)], cwd=clone, env=env,
                              capture_output=True, text=True, timeout=180)
    log = f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert done.returncode == 0, log
    statuses = re.findall(r"^::rc (\d+) (\d+)$", done.stdout, re.MULTILINE)
    assert statuses == [(str(i), "0") for i in range(len(commands))], log
    assert re.findall(r"^::server-exit (\d+)$", done.stdout, re.MULTILINE) == ["0", "0"], log
    assert re.search(r"^working under fence 2$", done.stdout, re.MULTILINE), log
    with sqlite3.connect(clone / "resource.db") as db:
        assert db.execute("SELECT id, balance FROM accounts").fetchall() == [(1, "10.00")]
