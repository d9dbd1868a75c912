"""The docs site builds with ``mkdocs build --strict`` (a broken link or anchor fails it), and
docs/img/timeline.svg is exactly what docs/timeline.py draws."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from tests.system.readme.support import ROOT

MKDOCS = Path(sys.prefix) / "bin" / "mkdocs"
ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # no banner about the theme's successor


def test_docs_site_builds_strict(tmp_path: Path):
    assert MKDOCS.exists(), f"{MKDOCS} missing: `make install` installs the docs extra"
    site = tmp_path / "site"
    done = subprocess.run([str(MKDOCS), "build", "--strict", "--site-dir", str(site)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=ENV)
    assert done.returncode == 0, done.stdout + done.stderr
    for page in ("index.html", "getting-started/index.html", "concepts/index.html",
                 "http-api/index.html", "stores/index.html", "stores/etcd/index.html"):
        assert (site / page).is_file(), page
    concepts = (site / "concepts" / "index.html").read_text()
    assert "timeline.svg" in concepts and (site / "img" / "timeline.svg").is_file()


def test_a_broken_link_fails_the_build(tmp_path: Path):
    """--strict bites: the same site with one page linking to a missing page does not build."""
    docs = tmp_path / "docs"
    subprocess.run(["cp", "-r", str(ROOT / "docs"), str(docs)], check=True)
    (tmp_path / "mkdocs.yml").write_text((ROOT / "mkdocs.yml").read_text())
    with (docs / "concepts.md").open("a") as page:
        page.write("\nSee [a page that does not exist](no-such-page.md).\n")
    done = subprocess.run([str(MKDOCS), "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env=ENV)
    assert done.returncode != 0
    assert "no-such-page.md" in done.stdout + done.stderr


def test_timeline_svg_is_what_the_script_draws():
    spec = importlib.util.spec_from_file_location("timeline", ROOT / "docs" / "timeline.py")
    timeline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(timeline)
    committed = (ROOT / "docs" / "img" / "timeline.svg").read_text()
    assert timeline.render() == committed, "run `python docs/timeline.py` and commit the SVG"
    assert committed.startswith("<svg ") and "fence 5 &lt; highest 6: 409" in committed
