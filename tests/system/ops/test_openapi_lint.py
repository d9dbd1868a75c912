"""Both served OpenAPI documents pass Redocly's linter, recommended rules, with zero errors and
zero warnings: operationIds, security on every operation, servers, items on arrays,
required properties defined.

The linter is ``@redocly/cli`` from the npm registry, pinned, installed by ``make node-deps``
(a prerequisite of ``make test``) into ``.tools/redocly``; run on the machine's Node. The
documents are fetched from real servers: lockd on SQLite, the proxy on PostgreSQL serving a
table of every column kind and a composite key (so every per-table path is linted).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.conftest import require
from tests.system.ops.test_schemathesis import KINDS_PG

ROOT = Path(__file__).resolve().parents[3]
REDOCLY = ROOT / ".tools" / "redocly" / "node_modules" / ".bin" / "redocly"


def lint(document: dict, directory: Path, name: str) -> str:
    """Redocly's output for ``document`` (recommended rules); fails the test on a crash."""
    path = directory / f"{name}.json"
    path.write_text(json.dumps(document))
    done = subprocess.run([str(REDOCLY), "lint", "--extends=recommended", "--format=stylish",
                           str(path)], capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    return out if done.returncode == 0 and "valid" in out else f"exit {done.returncode}\n{out}"


@pytest.fixture
def redocly() -> Path:
    require(None if shutil.which("node") else "node is not installed", "Node.js")
    require(None if REDOCLY.exists() else f"{REDOCLY} missing: run `make node-deps`", "redocly")
    return REDOCLY


def assert_clean(output: str) -> None:
    assert "Woohoo! Your API description is valid." in output, output
    assert not re.search(r"\b(error|warning)\b", output.split("validating", 1)[-1]), output


def test_lockd_openapi_is_lint_clean(redocly, start_lockd, tmp_path):
    lockd = start_lockd("sqlite")
    doc = httpx.get(f"{lockd.url}/openapi.json").json()
    ids = {op["operationId"] for ops in doc["paths"].values() for op in ops.values()}
    assert {"acquire", "renew", "release", "listLocks", "getLock", "forceRelease"} <= ids
    body = doc["paths"]["/v1/locks/{name}/acquire"]["post"]["requestBody"]
    assert body["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/AcquireRequest"}
    assert_clean(lint(doc, tmp_path, "lockd"))


def test_proxy_openapi_is_lint_clean(redocly, start_lockd, start_proxy, pg_dsn, tmp_path):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(KINDS_PG)
    lockd = start_lockd("sqlite")
    proxy = start_proxy(lockd, db="postgres", args=("--tables", "items,kinds,pairs"))
    doc = httpx.get(f"{proxy.url}/openapi.json").json()
    ids = [op.get("operationId") for ops in doc["paths"].values() for op in ops.values()]
    assert None not in ids and len(ids) == len(set(ids))
    assert {"kinds.insertRow", "kinds.putRow", "pairs.deleteRow", "batch", "claimFence"} <= set(ids)
    named = set(doc["components"]["schemas"])
    assert {"kinds.Row", "pairs.RowPatch", "StoredRow", "RowList", "BatchRequest", "BatchResponse",
            "Fence", "RowLock", "TableList", "Activity", "Health"} <= named, named
    body = doc["paths"]["/v1/tables/kinds/rows"]["post"]["requestBody"]["content"]
    assert body["application/json"]["schema"] == {"$ref": "#/components/schemas/kinds.Row"}
    assert_clean(lint(doc, tmp_path, "proxy"))


def test_the_linter_catches_what_it_should(redocly, tmp_path):
    """The check can fail: a document with the issue's defects is reported."""
    bad = {"openapi": "3.1.0", "info": {"title": "x", "version": "1"}, "servers": [],
           "paths": {"/a": {"get": {"responses": {"200": {"description": "ok", "content": {
               "application/json": {"schema": {"type": "array"}}}}}}}}}
    output = lint(bad, tmp_path, "bad")
    assert "no-empty-servers" in output and "operation-operationId" in output, output
    with pytest.raises(AssertionError):
        assert_clean(output)
