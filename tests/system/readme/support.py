"""The examples of the README and of docs/ as tests: Sybil parsers, the servers they talk to.

The examples name lockd at ``http://127.0.0.1:7070`` and the proxy at
``http://127.0.0.1:7071`` (the servers' defaults). The tests never take those ports (a reader's
Quick start may be running there): the servers start on free ports and each example's text is
run with ``127.0.0.1:7070``/``:7071`` replaced by them (``ported``); ``lockctl`` without
``--url`` finds lockd through ``LOCKD_URL``.

Conventions (also in docs/development.md), the same for README.md and every page under docs/:

- ```python blocks run in order in one namespace per document, in the document's temporary
  directory (the console blocks' too), so a file an example writes never lands in the checkout;
- ```console blocks: every line starting with ``$ `` runs in ``bash`` (cwd: a temporary
  directory) and must exit 0; the other lines show output and are not compared;
- ```yaml blocks are proxy policy files: the proxy's loader must accept them;
- any other block, and a python/console block that cannot run here, must be preceded by
  ``<!-- skip: next "illustrative" -->`` (Sybil's own skip directive; any reason text works):
  an unmarked block of another language fails as "neither run nor marked illustrative".
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
from sybil import Example, Region
from sybil.evaluators.python import PythonEvaluator, pad
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser
from sybil.parsers.markdown.lexers import RawFencedCodeBlockLexer

from harness import (
    PG_ADMIN_DSN,
    VENV_BIN,
    ServiceProcess,
    create_database,
    drop_database,
    free_port,
    wait_for,
)

LOCKD_PORT, PROXY_PORT = 7070, 7071  # what the examples name; the tests' servers run elsewhere
LOCKD_URL, PROXY_URL = f"http://127.0.0.1:{LOCKD_PORT}", f"http://127.0.0.1:{PROXY_PORT}"
LOCKD_ADDRESS, PROXY_ADDRESS = "README_LOCKD_ADDRESS", "README_PROXY_ADDRESS"  # keys of the env
PORT_LOCK = Path(tempfile.gettempdir()) / "lockd-readme-ports.lock"
RUN_LANGUAGES = ("python", "console", "yaml")
ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "README.md"

#: The policy and table the Python examples write through the proxy: row 1 as the README's
#: Quick start leaves it (balance 10.00), so its Python example reads here what it reads there.
README_POLICY = 'tables:\n  accounts: "accounts/{key}"\n'
README_SCHEMA = ("CREATE TABLE accounts (id integer PRIMARY KEY, balance numeric(12, 2) NOT NULL);"
                 "INSERT INTO accounts VALUES (1, 10.00);")
SKIP_MARK = re.compile(r"^<!--\s*skip:")
RUNNABLE_FENCE = re.compile(r"^```(python|console)\s*$")


@contextlib.contextmanager
def readme_ports(timeout: float = 120.0) -> Iterator[None]:
    """Hold 127.0.0.1:7070/7071 for this process: an exclusive flock, then wait for them free.

    Only for a test that must run a server on the documented ports themselves; the examples
    do not (``readme_servers``). Raises ``TimeoutError`` naming the port if something outside
    these tests holds it.
    """
    with open(PORT_LOCK, "w") as handle:
        deadline = time.monotonic() + timeout

        def locked() -> bool:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True

        wait_for(locked, timeout=timeout, interval=0.2, what=f"{PORT_LOCK} (another run holds it)")
        for port in (LOCKD_PORT, PROXY_PORT):
            wait_for(lambda port=port: _port_free(port),
                     timeout=max(0.0, deadline - time.monotonic()), interval=0.2,
                     what=f"127.0.0.1:{port} to be free: the README's examples need it")
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def ported(text: str, env: dict[str, str]) -> str:
    """``text`` with the documented addresses (``127.0.0.1:7070``, ``127.0.0.1:7071``) replaced
    by those of the servers ``readme_servers`` started (``env``)."""
    return (text.replace(f"127.0.0.1:{LOCKD_PORT}", env[LOCKD_ADDRESS])
            .replace(f"127.0.0.1:{PROXY_PORT}", env[PROXY_ADDRESS]))


@contextlib.contextmanager
def readme_servers(directory: Path, admin_dsn: str = PG_ADMIN_DSN) -> Iterator[dict[str, str]]:
    """lockd (SQLite) and the proxy on a fresh PostgreSQL database, each on a free port.

    The database holds ``accounts`` (row 1, balance 10.00) under the policy
    ``accounts/{key}``; the proxy serves fenced objects from ``directory/objects``. Yields the
    environment the console examples run with (``LOCKD_URL`` names this lockd;
    ``LOCKD_ADDRESS``/``PROXY_ADDRESS`` are for ``ported``).
    """
    dsn = create_database(admin_dsn, prefix="readme")
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(README_SCHEMA)
        policy = directory / "policy.yaml"
        policy.write_text(README_POLICY)
        url = dsn.replace("postgresql://", "postgresql+psycopg://", 1)
        lockd_port, proxy_port = free_port(), free_port()
        lockd_url, proxy_url = (f"http://127.0.0.1:{lockd_port}",
                                f"http://127.0.0.1:{proxy_port}")
        lockd = ServiceProcess(
            [str(VENV_BIN / "lockd"), "serve", "--store", f"sqlite:///{directory}/lockd.db",
             "--key-dir", str(directory / "keys"), "--port", str(lockd_port)],
            ready_url=f"{lockd_url}/healthz", log_path=directory / "lockd.log")
        proxy = ServiceProcess(
            [str(VENV_BIN / "resource-proxy"), "serve", "--database-url", url,
             "--lockd-url", lockd_url, "--policy", str(policy), "--port", str(proxy_port),
             "--objects-dir", str(directory / "objects")],
            ready_url=f"{proxy_url}/healthz", log_path=directory / "proxy.log")
        with lockd, proxy:
            yield {"PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                   "LOCKD_URL": lockd_url,
                   LOCKD_ADDRESS: f"127.0.0.1:{lockd_port}",
                   PROXY_ADDRESS: f"127.0.0.1:{proxy_port}"}
    finally:
        drop_database(dsn, admin_dsn)


def needs_servers(text: str) -> bool:
    """Whether a document has a python or console block not marked illustrative (skipped)."""
    previous = ""
    for line in text.splitlines():
        if RUNNABLE_FENCE.match(line) and not SKIP_MARK.match(previous):
            return True
        if line.strip():
            previous = line
    return False


def where(example: Example) -> str:
    """``README.md line 12`` / ``docs/client.md line 40``: where a failing example is."""
    path = Path(example.path)
    try:
        path = path.relative_to(ROOT)
    except ValueError:
        pass
    return f"{path} line {example.line}"


def console_commands(source: str) -> list[str]:
    """The ``$ `` lines of a console block, without the prompt; a line ending in ``\\`` goes on
    on the next line, as in a shell."""
    commands: list[str] = []
    continued = False
    for line in source.splitlines():
        if continued:
            commands[-1] += "\n" + line
        elif line.startswith("$ "):
            commands.append(line[2:])
        else:
            continue
        continued = line.endswith("\\")
    return commands


class ConsoleEvaluator:
    """Runs each ``$ `` line of a console block in one bash, in order; each must exit 0.

    The environment and directory come from the ``readme_env`` fixture (in the namespace).
    """

    def __call__(self, example: Example) -> str | None:
        env, cwd = example.namespace["readme_env"]
        commands = [ported(cmd, env) for cmd in console_commands(example.parsed)]
        if not commands:
            return f"{where(example)}: a console block without a `$ ` command"
        script = "".join(f"{cmd}\n__rc=$?; [ $__rc -eq 0 ] || {{ echo \"exit $__rc: \"{_quote(cmd)} >&2; exit 1; }}\n"
                         for cmd in commands)
        done = subprocess.run(["bash", "-c", script], cwd=cwd, env={**os.environ, **env},
                              capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            return (f"{where(example)}: {done.stderr.strip()}\n"
                    f"stdout:\n{done.stdout}")
        return None


def evaluate_policy(example: Example) -> str | None:
    """A ``yaml`` block is a proxy policy file: the proxy's own loader must accept it."""
    from resource_proxy.policy import PolicyError, load_policy

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "policy.yaml"
        path.write_text(str(example.parsed))
        try:
            policy = load_policy(path)
        except PolicyError as exc:
            return f"{where(example)}: the policy is refused: {exc}"
    if policy.tables or policy.buckets.templates:
        return None
    return f"{where(example)}: a policy with no table and no bucket"


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


class UnmarkedBlockParser:
    """Every fenced block of a language not run here: fails unless a skip marks it illustrative."""

    lexer = RawFencedCodeBlockLexer(
        info_pattern=re.compile(r"(?P<language>[^\n]*)$\n", re.MULTILINE),
        mapping={"language": "language", "source": "source"})

    def __call__(self, document) -> Iterator[Region]:
        for region in self.lexer(document):
            if region.lexemes["language"].strip() in RUN_LANGUAGES:
                continue
            region.parsed = region.lexemes["language"].strip() or "(no language)"
            region.evaluator = self.evaluate
            yield region

    @staticmethod
    def evaluate(example: Example) -> str:
        return (f"{where(example)}: a ```{example.parsed} block is neither run nor marked "
                'illustrative: precede it with <!-- skip: next "illustrative" --> '
                "(see docs/development.md)")


class PortedPythonEvaluator(PythonEvaluator):
    """Sybil's Python evaluator, run on the block's text with the documented ports replaced by
    the test servers' (``ported``); a page that starts no servers runs its blocks as written."""

    def __call__(self, example: Example) -> None:
        __tracebackhide__ = True
        env, cwd = example.namespace["readme_env"]
        with contextlib.chdir(cwd):  # files an example writes land in its temporary directory
            if LOCKD_ADDRESS not in env:
                return super().__call__(example)
            source = pad(ported(str(example.parsed), env),
                         example.line + example.parsed.line_offset)
            exec(compile(source, example.path, "exec", dont_inherit=True), example.namespace)
            example.namespace.pop("__builtins__", None)
        return None


def parsers() -> list:
    """The Sybil parsers for README.md and docs/, in the order above."""
    python = PythonCodeBlockParser()
    python.codeblock_parser._evaluator = PortedPythonEvaluator()  # type: ignore[attr-defined]
    return [SkipParser(), python,
            CodeBlockParser(language="console", evaluator=ConsoleEvaluator()),
            CodeBlockParser(language="yaml", evaluator=evaluate_policy),
            UnmarkedBlockParser()]
