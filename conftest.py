"""Collects the examples of README.md and of every page under docs/ as tests (Sybil); see
tests/system/readme/support.py for the rules."""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

import pytest
from sybil import Sybil

# Servers the suite starts are forked from one preloaded process per test process
# (harness/zygote.py): the same programs, without their imports paid on every start.
# HARNESS_ZYGOTE=0 starts each with a plain exec.
os.environ.setdefault("HARNESS_ZYGOTE", "1")

# A suite started in the background by a non-interactive shell (`make test &`) inherits SIGINT
# ignored, and every process it started would too: the tests that interrupt a child (Ctrl-C to
# `lockctl watch`, to the demo) need Ctrl-C delivered, as it is from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

from harness import VENV_BIN  # noqa: E402
from tests.parallel import arrange, make_scheduler, mark
from tests.system.readme.support import needs_servers, parsers, readme_servers


@pytest.fixture(scope="module")
def readme_env(request):
    """lockd on :7070 and the proxy on :7071 for one document's examples: (env, cwd).

    A page whose every block is illustrative (or that has no python/console block) starts no
    servers: its blocks only need the checks that run without them.
    """
    with tempfile.TemporaryDirectory(prefix="readme-") as tmp:
        directory = Path(tmp)
        (directory / "work").mkdir()
        if not needs_servers(Path(request.node.path).read_text()):
            yield {"PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}, directory / "work"
            return
        with readme_servers(directory) as env:
            yield env, directory / "work"


pytest_collect_file = Sybil(parsers=parsers(), patterns=["README.md", "docs/*.md", "docs/*/*.md"],
                            fixtures=["readme_env"]).pytest()


def pytest_itemcollected(item):
    """The check tier's mark (tests/parallel.py)."""
    mark(item)


def pytest_xdist_make_scheduler(config, log):
    """A test file (or a machine group) runs on one worker whole (tests/parallel.py)."""
    return make_scheduler(config, log)


def pytest_collection_modifyitems(config, items):
    """Longest test files first (tests/parallel.py)."""
    arrange(items)
