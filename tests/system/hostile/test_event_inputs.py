"""lockd's side: a ``Last-Event-ID`` that is not a plain decimal event id (``²``
passes ``str.isdigit()``) is a 422 problem, never a 500; an empty one is no id at all."""

from __future__ import annotations

import httpx

from tests.server.calls import assert_problem


def test_a_malformed_last_event_id_is_422(inproc_lockd):
    srv = inproc_lockd()
    with httpx.Client(timeout=10) as http:
        for raw in ("²".encode(), "٣".encode(), b"12a", b"-1", b"9" * 40):
            r = http.get(f"{srv.url}/v1/events", headers={"Last-Event-ID": raw})
            assert_problem(r, 422, "invalid_request")
        with http.stream("GET", f"{srv.url}/v1/events", headers={"Last-Event-ID": b"7"}) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
