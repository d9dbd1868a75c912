"""docs/sql-fencing.md runs as written: its ```python blocks, in order, in one namespace, against
a real lockd and a fresh PostgreSQL database (``LOCKD_URL``, ``DATABASE_URL``), in a directory
where each ```yaml block that starts with ``# <file name>`` has been written to that file.

So the page cannot drift from the code: a renamed function, a changed error or a different
result fails here (the examples assert what they show).
"""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
import pytest

from harness import create_database, drop_database, pg_available

pytestmark = pytest.mark.skipif(pg_available() is not None, reason="PostgreSQL not reachable")

PAGE = Path(__file__).resolve().parents[2] / "docs" / "sql-fencing.md"
_BLOCK = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
_FILE_NAME = re.compile(r"#\s*([\w.-]+)\s*$")


def blocks(kind: str) -> list[str]:
    """The page's fenced blocks of ``kind`` (``python``, ``yaml``), in page order."""
    return [body for lang, body in _BLOCK.findall(PAGE.read_text()) if lang == kind]


def test_the_page_has_its_examples():
    python = "\n".join(blocks("python"))
    for needed in ("install(", "fenced_transaction(conn, lease)", "Session(engine)",
                   "StaleTokenError", "SharedTokenError"):
        assert needed in python, needed
    assert "resource-proxy db install --database-url URL" in PAGE.read_text()


def test_the_examples_run_against_lockd_and_postgresql(lockd_server, tmp_path, monkeypatch):
    dsn = create_database(prefix="sqldocs")
    monkeypatch.setenv("LOCKD_URL", lockd_server.url)
    monkeypatch.setenv("DATABASE_URL", dsn)
    monkeypatch.chdir(tmp_path)
    for text in blocks("yaml"):
        first, _, _ = text.partition("\n")
        named = _FILE_NAME.fullmatch(first.strip())
        if named:
            (tmp_path / named.group(1)).write_text(text)
    namespace: dict = {"__name__": "sql_fencing_docs"}
    try:
        examples = blocks("python")
        assert len(examples) >= 5
        for index, code in enumerate(examples):
            # dont_inherit: not this module's ``from __future__ import annotations`` (the ORM
            # example's annotations are evaluated, as in a script of its own)
            where = f"{PAGE.name}[python block {index}]"
            exec(compile(code, where, "exec", dont_inherit=True), namespace)
        namespace["engine"].dispose()
        with psycopg.connect(dsn) as conn:  # what the examples left: every write was fenced
            assert conn.execute("SELECT id, balance FROM accounts ORDER BY id").fetchall() == \
                [(42, 96), (43, 95)]
            fences = dict(conn.execute("SELECT lock, highest FROM fencing.fences").fetchall())
        assert set(fences) == {"accounts/42", "accounts/43"}
        assert fences["accounts/42"] == namespace["newer"].fence
    finally:
        drop_database(dsn)


README = PAGE.parents[1] / "README.md"


def test_the_readme_section_runs(lockd_server):
    """README's "Fencing your own SQL" block, with the reader's URLs replaced by the test's lockd
    and a fresh database where ``accounts`` is protected under ``accounts/{id}``."""
    import sqlalchemy as sa

    from resource_proxy.dbfence import install
    from resource_proxy.policy import Policy, TablePolicy, Template

    section = README.read_text().split("## Fencing your own SQL", 1)[1].split("\n## ", 1)[0]
    (code,) = [body for lang, body in _BLOCK.findall(section) if lang == "python"]
    assert '"http://127.0.0.1:7070"' in code and '"postgresql://app@db/bank"' in code
    assert 'accounts: "accounts/{id}"' in section and "--policy policy.yaml" in section
    assert "fencing.lock_for('accounts', '42')" in code  # the row's lock, not built by hand
    dsn = create_database(prefix="sqlreadme")
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL)")
            conn.execute("INSERT INTO accounts VALUES (42, 100)")
        engine = sa.create_engine(dsn.replace("postgresql://", "postgresql+psycopg://", 1),
                                  poolclass=sa.NullPool)
        install(engine, Policy({"accounts": TablePolicy(Template.parse("accounts/{id}",
                                                                       "accounts"))}),
                tables=["accounts"])
        engine.dispose()
        code = code.replace('"http://127.0.0.1:7070"', repr(lockd_server.url)).replace(
            '"postgresql://app@db/bank"', repr(dsn))
        exec(compile(code, "README.md[Fencing your own SQL]", "exec", dont_inherit=True), {})
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT balance FROM accounts WHERE id = 42").fetchone() == (95,)
            assert conn.execute("SELECT highest FROM fencing.fences WHERE lock = "
                                "'accounts/42'").fetchone() is not None
    finally:
        drop_database(dsn)
