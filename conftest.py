"""Collects the examples of README.md and of every page under docs/ as tests (Sybil); see
tests/system/readme/support.py for the rules."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from sybil import Sybil

from harness import VENV_BIN
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
