"""HTTP helpers for the election tests: the routes, the observe stream, candidates in threads.

Plain httpx against a real ``lockd serve``; no client library.
"""

from __future__ import annotations

import base64
import itertools
import json
import threading
from typing import Any

import httpx

from tests.server.calls import wait_until

__all__ = ["Observer", "call", "campaign", "claims", "election", "parse_sse", "queue_candidates",
           "read_events", "result", "stable", "start_candidate"]


def campaign(http: httpx.Client, url: str, name: str, ttl_ms: int = 10_000,
             **fields: Any) -> httpx.Response:
    return http.post(f"{url}/v1/elections/{name}/campaign", json={"ttl_ms": ttl_ms, **fields})


def call(http: httpx.Client, url: str, name: str, action: str, headers: dict | None = None,
         **fields: Any) -> httpx.Response:
    return http.post(f"{url}/v1/elections/{name}/{action}", json=fields, headers=headers)


def election(http: httpx.Client, url: str, name: str) -> dict[str, Any]:
    r = http.get(f"{url}/v1/elections/{name}")
    assert r.status_code == 200, r.text
    return r.json()


def claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def parse_sse(lines, events: list, until: int | None = None) -> None:
    """Append ``(id, kind, data)`` of each SSE event read from ``lines``; stop at ``until``."""
    kind, data, event_id = "message", "", None
    for line in lines:
        if line.startswith("id: "):
            event_id = int(line[4:])
        elif line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            data = line[6:]
        elif not line and data:
            events.append((event_id, kind, json.loads(data)))
            kind, data, event_id = "message", "", None
            if until is not None and len(events) >= until:
                return


def read_events(url: str, name: str, count: int, last_id: str | None = None
                ) -> list[tuple[int, str, dict]]:
    """The first ``count`` events of a fresh observe stream (``Last-Event-ID``: ``last_id``)."""
    headers = {"Last-Event-ID": last_id} if last_id is not None else {}
    events: list = []
    with httpx.stream("GET", f"{url}/v1/elections/{name}/observe", headers=headers,
                      timeout=httpx.Timeout(10)) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        parse_sse(r.iter_lines(), events, count)
    assert len(events) == count, events
    return events


class Observer(threading.Thread):
    """Reads an observe stream in the background until ``stop`` (needs short heartbeats)."""

    def __init__(self, url: str, name: str):
        super().__init__(daemon=True)
        self.url, self.name = url, name
        self.events: list[tuple[int, str, dict]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.stream("GET", f"{self.url}/v1/elections/{self.name}/observe",
                          timeout=httpx.Timeout(10)) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            parse_sse(itertools.takewhile(lambda _: not self.stop.is_set(), lines), self.events)

    def wait_for_seq(self, seq: int) -> None:
        wait_until(lambda: self.events and self.events[-1][0] >= seq, timeout=10,
                   what=f"the observer to reach seq {seq}")


def start_candidate(url: str, name: str, owner: str, results: list, *, wait_ms: int = 20_000,
                     ttl_ms: int = 10_000) -> threading.Thread:
    """Campaign in a thread; append ``(owner, response)``."""

    def run() -> None:
        with httpx.Client(timeout=60) as c:
            results.append((owner, campaign(c, url, name, ttl_ms, wait_ms=wait_ms, owner=owner,
                                            value=f"v-{owner}")))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def queue_candidates(http, url, name, owners, results) -> dict[str, threading.Thread]:
    """Queue one campaign per owner, each confirmed waiting before the next."""
    threads = {}
    for i, owner in enumerate(owners):
        threads[owner] = start_candidate(url, name, owner, results)
        wait_until(lambda n=i + 1: election(http, url, name)["waiters"] == n,
                   what=f"{owner} queued")
    return threads


def stable(doc: dict[str, Any]) -> dict[str, Any]:
    """An election's state without the leader's time left (it counts down between reads)."""
    leader = doc["leader"] and {k: v for k, v in doc["leader"].items() if k != "ttl_ms"}
    return {**doc, "leader": leader}


def result(results: list, owner: str) -> dict[str, Any]:
    (r,) = [r for o, r in results if o == owner]
    assert r.status_code == 200, r.text
    return r.json()
