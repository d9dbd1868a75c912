"""Collects README.md's examples as tests (Sybil); see tests/system/readme/support.py for the rules."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from sybil import Sybil

from tests.system.readme.support import parsers, readme_servers


@pytest.fixture(scope="module")
def readme_env():
    """lockd on :7070 and the proxy on :7071 for the README's examples: (env, cwd)."""
    with tempfile.TemporaryDirectory(prefix="readme-") as tmp:
        directory = Path(tmp)
        (directory / "work").mkdir()
        with readme_servers(directory) as env:
            yield env, directory / "work"


pytest_collect_file = Sybil(parsers=parsers(), patterns=["README.md"],
                            fixtures=["readme_env"]).pytest()
