"""Schemathesis against both services' OpenAPI documents, on real server processes (loopback).

Every operation gets ``EXAMPLES`` generated requests in positive mode (valid by the schema) and
as many in negative mode (invalid), derandomized so a run is repeatable. Checks: no 5xx, every
status documented, the documented content type, the body matching the documented schema, the
documented headers. The SSE streams are left out (a stream never ends). The proxy runs on
PostgreSQL with a table of many column types; positive requests carry a genuine fencing token
so their rows reach the database. The request counts show in pytest's summary.
"""

from __future__ import annotations

import collections
import time
import uuid

import httpx
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance, response_headers_conformance]
KINDS_PG = """
CREATE TABLE kinds (id integer PRIMARY KEY, i integer, n numeric(40,20), f double precision,
                    t text, vc varchar(5), b boolean, ts timestamptz, d date, u uuid, j jsonb,
                    arr integer[], big bigint NOT NULL DEFAULT 0);
CREATE TABLE pairs (a integer, b text, v text, PRIMARY KEY (a, b));
"""


def _runner(operation: schemathesis.APIOperation, mode: schemathesis.GenerationMode,
            base_url: str, session: requests.Session, examples: int,
            headers: dict[str, str] | None, counts: collections.Counter[str]):
    """The hypothesis test of one operation in one generation mode."""

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
    def run(case: schemathesis.Case) -> None:
        response = case.call(base_url=base_url, session=session, headers=headers, timeout=15)
        counts[operation.label] += 1
        case.validate_response(response, checks=CHECKS)

    return run


def fuzz(base_url: str, examples: int, headers: dict[str, str] | None = None,
         ) -> tuple[collections.Counter[str], list[str]]:
    """Run every operation of ``base_url``'s document; (requests per operation, failures).
    ``headers`` go with positive requests only (negative ones keep what was generated)."""
    schema = schemathesis.openapi.from_url(base_url + "/openapi.json")
    session = requests.Session()
    counts: collections.Counter[str] = collections.Counter()
    failures: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.path.endswith("/events"):
            continue
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            run = _runner(operation, mode, base_url, session, examples,
                          headers if mode.is_positive else None, counts)
            try:
                run()
            except Unsatisfiable:
                pass  # nothing to negate (no parameters, no body)
            except (Exception, BaseExceptionGroup) as exc:  # report every operation's failure
                failures.append(f"{operation.label} [{mode.value}]: {str(exc)[:2000]}")
    return counts, failures


def test_lockd_openapi_holds(start_lockd, record_property):
    lockd = start_lockd("sqlite", env={"LOCKD_MAX_WAIT_MS": "200",
                                       "LOCKD_ADMIN_KEYS": "fuzz-admin-key-0"})
    started = time.monotonic()
    counts, failures = fuzz(lockd.url, 50)
    record_property("schemathesis_requests", sum(counts.values()))
    record_property("schemathesis_seconds", round(time.monotonic() - started, 1))
    assert not failures, "\n\n".join(failures)
    assert counts["POST /v1/locks/{name}/acquire"] >= 50
    assert sum(counts.values()) >= 400
    assert httpx.get(lockd.url + "/healthz").status_code == 200


def test_proxy_openapi_holds(start_lockd, start_proxy, pg_dsn, record_property, tmp_path):
    import psycopg

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(KINDS_PG)
    lockd = start_lockd("sqlite")
    lock = f"fuzz-{uuid.uuid4().hex[:8]}"  # one literal lock governs every fuzzed table
    policy = tmp_path / "fuzz-policy.yaml"
    policy.write_text(f"tables: {{items: {lock}, kinds: {lock}, pairs: {lock}}}\n")
    proxy = start_proxy(lockd, db="postgres",
                        args=("--tables", "items,kinds,pairs", "--policy", str(policy)))
    lease = httpx.post(f"{lockd.url}/v1/locks/{lock}/acquire", json={"ttl_ms": 3_600_000}).json()
    started = time.monotonic()
    counts, failures = fuzz(proxy.url, 30, {"Fencing-Token": lease["token"]})
    record_property("schemathesis_requests", sum(counts.values()))
    record_property("schemathesis_seconds", round(time.monotonic() - started, 1))
    assert not failures, "\n\n".join(failures)
    assert counts["PUT /v1/tables/kinds/rows/{key}"] >= 30
    assert sum(counts.values()) >= 600
    with psycopg.connect(pg_dsn) as conn:  # positive requests reached the database
        assert conn.execute("SELECT count(*) FROM kinds").fetchone()[0] > 0
    assert httpx.get(proxy.url + "/healthz").status_code == 200

