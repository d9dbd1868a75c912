"""Schemathesis against both services' OpenAPI documents, on real server processes (loopback).

Every operation gets ``EXAMPLES`` generated requests in positive mode (valid by the schema) and
as many in negative mode (invalid), derandomized so a run is repeatable. Checks: no 5xx, every
status documented, the documented content type, the body matching the documented schema, the
documented headers. The SSE streams (lock events, election observers) are left out (a stream
never ends). The proxy runs on PostgreSQL with a table of many column types; positive requests
carry a genuine fencing token so their rows reach the database. The request counts show in
pytest's summary.

Hostile inputs: schemathesis draws values from the schema, which says "string" or
"integer" and so never produces the inputs that used to crash the servers. So half of the
generated cases (in both modes, within the same example budget) are *hostile variants*: one
value of the case (a body value or key, a query or path parameter, a header) is replaced by a
lone surrogate (JSON bodies only: a URL or header cannot carry one), a timestamp at the edge of
``datetime``'s range with a zone offset (``0001-01-01T00:00:00+01:00``), or non-ASCII digits
(``²``, ``٣``; headers: Latin-1 ones). Random placement can miss the one column where a value
bites (a timestamp column among twelve), so every operation also gets explicit hostile cases
(``_explicit_hostile``): each body property of its schema, each path and query parameter, given
each of ``EXPLICIT`` in turn, on top of a case that succeeded. The same checks apply: no 5xx, a
documented 4xx. To
keep the run within its former time (hostile cases and keyed writes cost a little more each),
the budgets went from 50 to 40 examples per operation and mode (lockd) and from 30 to 20 (proxy).
"""

from __future__ import annotations

import collections
import copy
import json
import time
import uuid
from datetime import datetime

import httpx
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
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


# -- hostile values -----------------------------------------------------------------------------

def _offset(minutes: int) -> str:
    return f"{'+' if minutes >= 0 else '-'}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


EDGE_TIMESTAMPS = st.builds(
    lambda moment, offset: moment.isoformat() + offset,
    st.one_of(st.datetimes(max_value=datetime(1, 1, 2)), st.datetimes(min_value=datetime(9999, 12, 30))),
    st.integers(-1439, 1439).map(_offset),
)
UNICODE_DIGITS = st.one_of(
    st.sampled_from(["²", "٣", "１２", "²³", "1²", "٣٠٠٠"]),
    st.text(st.characters(categories=("Nd", "No"), exclude_characters="0123456789"),
            min_size=1, max_size=6),
)
SURROGATES = st.one_of(
    st.sampled_from(["\ud800", "a\udfff", "\udc80\ud800"]),
    st.builds(str.__add__, st.text(max_size=3),
              st.text(st.characters(categories=("Cs",)), min_size=1, max_size=2)),
)
HOSTILE = {  # where a value goes -> what may go there
    "body": st.one_of(SURROGATES, EDGE_TIMESTAMPS, UNICODE_DIGITS),
    "url": st.one_of(EDGE_TIMESTAMPS, UNICODE_DIGITS, st.just("9" * 5000)),
    "header": st.sampled_from(["²", "³", "¹²", "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"]),
}


EXPLICIT = ("\ud800", "9999-12-31T23:59:59-01:00", "²")
EXPLICIT_URL = ("²", "0001-01-01T00:00:00+01:00", "9" * 5000)
EXPLICIT_HEADER = ("²", "9999-12-31T23:59:59-01:00")  # a header carries Latin-1 only


def _body_slots(body, slots: list, limit: int = 50) -> None:
    """(container, key, kind) of every JSON leaf and every object key of ``body``."""
    stack = [body]
    while stack and len(slots) < limit:
        item = stack.pop()
        pairs = item.items() if isinstance(item, dict) else enumerate(item) if isinstance(item, list) else ()
        for key, value in list(pairs):
            if isinstance(item, dict):
                slots.append((item, key, "rename"))
            if isinstance(value, dict | list):
                stack.append(value)
            else:
                slots.append((item, key, "value"))


def _hostile_variant(case: schemathesis.Case, counts: collections.Counter[str]):
    """A strategy of ``case`` with one value replaced by a hostile one (``case`` if it has none)."""
    targets = [(name, "url") for name in (case.path_parameters or {})]
    targets += [(name, "query") for name in (case.query or {})]
    targets += [(name, "header") for name in (case.headers or {})
                if name.lower() not in ("authorization", "fencing-token")]  # those: 401 at once
    if isinstance(case.body, dict | list) and case.body:
        targets += [(None, "body")] * 3  # where most values reach a database: weigh it more
    if not targets:
        return st.just(case)

    def apply(choice: tuple[str | None, str], pick: int, value: str):
        name, where = choice
        if where == "body":
            body = copy.deepcopy(case.body)
            slots: list = []
            _body_slots(body, slots)
            container, key, kind = slots[pick % len(slots)]
            if kind == "rename":
                container[value] = container.pop(key)
            else:
                container[key] = value
            case.body = json.dumps(body).encode()  # bytes go as they are: surrogates \u-escaped
        elif where == "url":
            case.path_parameters = {**case.path_parameters, name: value}
        elif where == "query":
            case.query = {**case.query, name: value}
        else:
            case.headers = {**case.headers, name: value}
        counts["hostile " + where] += 1
        return case

    return st.sampled_from(targets).flatmap(lambda choice: st.builds(
        apply, st.just(choice), st.integers(0, 49),
        HOSTILE["url" if choice[1] == "query" else choice[1]]))


def _resolve(raw: dict, schema: dict) -> dict:
    ref = schema.get("$ref", "")
    return raw["components"]["schemas"][ref.rsplit("/", 1)[1]] if ref else schema


def _explicit_hostile(operation: schemathesis.APIOperation, case: schemathesis.Case, raw: dict,
                      base_url: str, session: requests.Session, headers: dict[str, str] | None,
                      counts: collections.Counter[str]) -> list[str]:
    """``EXPLICIT`` values in every body property, ``EXPLICIT_URL`` ones in every path and query
    parameter (``EXPLICIT_HEADER`` in every header but the token) of ``operation``, each on top of ``case`` (one that succeeded, if any did); the
    failures."""
    spec = raw["paths"][operation.path][operation.method.lower()]
    content = spec.get("requestBody", {}).get("content", {}).get("application/json", {})
    properties = _resolve(raw, content.get("schema", {})).get("properties", {})
    base_body = case.body if isinstance(case.body, dict) else {}
    path, query = dict(case.path_parameters or {}), dict(case.query or {})
    base_headers = dict(case.headers or {})
    variants = [("body", name, value) for name in properties for value in EXPLICIT]
    variants += [("path", name, value) for name in path for value in EXPLICIT_URL]
    variants += [("query", p["name"], value) for p in spec.get("parameters", [])
                 if p.get("in") == "query" for value in EXPLICIT_URL]
    variants += [("header", p["name"], value) for p in spec.get("parameters", [])
                 if p.get("in") == "header" and p["name"].lower() != "fencing-token"
                 for value in EXPLICIT_HEADER]
    failures = []
    for where, name, value in variants:
        case.path_parameters = {**path, name: value} if where == "path" else path
        case.query = {**query, name: value} if where == "query" else query
        case.headers = {**base_headers, name: value} if where == "header" else base_headers
        if where == "body" or content:
            case.body = json.dumps({**base_body, name: value} if where == "body" else base_body).encode()
        response = case.call(base_url=base_url, session=session, headers=headers, timeout=15)
        counts["hostile explicit"] += 1
        try:
            case.validate_response(response, checks=CHECKS)
        except (Exception, BaseExceptionGroup) as exc:
            failures.append(f"{operation.label} [explicit {where} {name}={value[:40]!r}]: "
                            f"{str(exc)[:1000]}")
    return failures


def _runner(operation: schemathesis.APIOperation, mode: schemathesis.GenerationMode,
            base_url: str, session: requests.Session, examples: int,
            headers: dict[str, str] | None, counts: collections.Counter[str],
            succeeded: dict[str, schemathesis.Case]):
    """The hypothesis test of one operation in one generation mode (half of the cases hostile);
    a positive case that succeeded (else one that was answered) is kept in ``succeeded``."""
    cases = operation.as_strategy(generation_mode=mode)
    cases = st.one_of(cases, cases.flatmap(lambda case: _hostile_variant(case, counts)))

    @given(case=cases)
    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
    def run(case: schemathesis.Case) -> None:
        response = case.call(base_url=base_url, session=session, headers=headers, timeout=15)
        counts[operation.label] += 1
        quick = response.elapsed < 0.05  # seconds: not an acquire that waited
        if mode.is_positive and quick and not isinstance(case.body, bytes) and (
                response.status_code < 300
                or (response.status_code < 500 and operation.label not in succeeded)):
            succeeded[operation.label] = case  # the last quick 2xx; else the first answered one
        case.validate_response(response, checks=CHECKS)

    return run


def fuzz(base_url: str, examples: int, headers: dict[str, str] | None = None,
         ) -> tuple[collections.Counter[str], list[str]]:
    """Run every operation of ``base_url``'s document; (requests per operation, failures).
    ``headers`` go with positive requests only (negative ones keep what was generated)."""
    schema = schemathesis.openapi.from_url(base_url + "/openapi.json")
    raw = requests.get(base_url + "/openapi.json", timeout=10).json()
    session = requests.Session()
    counts: collections.Counter[str] = collections.Counter()
    failures: list[str] = []
    succeeded: dict[str, schemathesis.Case] = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.path.endswith(("/events", "/observe")):  # streams never end
            continue
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            run = _runner(operation, mode, base_url, session, examples,
                          headers if mode.is_positive else None, counts, succeeded)
            try:
                run()
            except Unsatisfiable:
                pass  # nothing to negate (no parameters, no body)
            except (Exception, BaseExceptionGroup) as exc:  # report every operation's failure
                failures.append(f"{operation.label} [{mode.value}]: {str(exc)[:2000]}")
        if operation.label in succeeded:
            failures += _explicit_hostile(operation, succeeded[operation.label], raw, base_url,
                                          session, headers, counts)
    return counts, failures


def _hostile_counts(counts: collections.Counter[str]) -> dict[str, int]:
    """Hostile variants drawn, by where the value went, and explicit hostile requests sent
    (they are popped from ``counts``)."""
    return {where: counts.pop("hostile " + where, 0)
            for where in ("body", "url", "query", "header", "explicit")}


def test_lockd_openapi_holds(start_lockd, record_property):
    lockd = start_lockd("sqlite", env={"LOCKD_MAX_WAIT_MS": "200",
                                       "LOCKD_ADMIN_KEYS": "fuzz-admin-key-0"})
    started = time.monotonic()
    counts, failures = fuzz(lockd.url, 40)
    hostile = _hostile_counts(counts)
    record_property("schemathesis_requests", sum(counts.values()))
    record_property("schemathesis_hostile", hostile)
    record_property("schemathesis_seconds", round(time.monotonic() - started, 1))
    assert not failures, "\n\n".join(failures)
    assert counts["POST /v1/locks/{name}/acquire"] >= 50
    assert sum(counts.values()) + hostile["explicit"] >= 400
    assert all(hostile[where] >= 20 for where in ("body", "url", "query")), hostile
    assert hostile["explicit"] >= 40, hostile
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
    counts, failures = fuzz(proxy.url, 20, {"Fencing-Token": lease["token"]})
    hostile = _hostile_counts(counts)
    record_property("schemathesis_requests", sum(counts.values()))
    record_property("schemathesis_hostile", hostile)
    record_property("schemathesis_seconds", round(time.monotonic() - started, 1))
    assert not failures, "\n\n".join(failures)
    assert counts["PUT /v1/tables/kinds/rows/{key}"] >= 30
    assert sum(counts.values()) + hostile["explicit"] >= 600
    assert all(hostile[where] >= 20 for where in ("body", "url", "query")), hostile
    assert hostile["explicit"] >= 200, hostile
    with psycopg.connect(pg_dsn) as conn:  # positive requests reached the database
        assert conn.execute("SELECT count(*) FROM kinds").fetchone()[0] > 0
    assert httpx.get(proxy.url + "/healthz").status_code == 200

