"""Every event stream of a lockd holds one of its ``LOCKD_MAX_EVENT_STREAMS`` slots, whatever its
kind (``/v1/events``, ``/v1/locks/{name}/events``, ``/v1/elections/{name}/observe``), and no
identity may hold more than a quarter of them (rounded up): beyond, 429
``too_many_identity_streams`` with ``Retry-After``, while other identities still get theirs.
A stream's slot is given back when it ends. Real ``lockd serve`` processes."""

from __future__ import annotations

import contextlib
import threading
import uuid

import httpx
import pytest

from lockd.server.limits import StreamSlots
from tests.server.calls import assert_problem, wait_until

KEY_A, KEY_B = "stream-key-a-0123456789", "stream-key-b-0123456789"


def _paths(run: str) -> list[str]:
    return [f"/v1/elections/{run}/e/observe", "/v1/events", f"/v1/locks/{run}/l/events",
            f"/v1/elections/{run}/f/observe"]


class _Streams:
    """Streams opened (and kept open) until ``close``."""

    def __init__(self) -> None:
        self.stack = contextlib.ExitStack()

    def open(self, url: str, key: str | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        client = self.stack.enter_context(httpx.Client(timeout=10))
        response = self.stack.enter_context(client.stream("GET", url, headers=headers))
        if response.status_code != 200:
            response.read()
        return response

    def close(self) -> None:
        self.stack.close()


@pytest.fixture
def streams():
    opened = _Streams()
    yield opened
    opened.close()


def test_election_observers_and_event_streams_share_one_bound(lockd_factory, tmp_path, streams):
    server = lockd_factory(f"sqlite:///{tmp_path}/lockd.db",
                           env={"LOCKD_MAX_EVENT_STREAMS": "2"})
    url, run = server.url, uuid.uuid4().hex[:8]
    for path in (f"/v1/elections/{run}/a/observe", f"/v1/elections/{run}/b/observe"):
        assert streams.open(url + path).status_code == 200
    for path in ("/v1/events", f"/v1/locks/{run}/x/events", f"/v1/elections/{run}/c/observe"):
        r = streams.open(url + path)
        assert_problem(r, 503, "too_many_streams")
        assert r.headers["Retry-After"] == "5"
    streams.close()  # the slots come back when the streams end
    wait_until(lambda: streams.open(url + "/v1/events").status_code == 200, 10, "a free slot")


def test_one_identity_cannot_take_every_slot(lockd_factory, tmp_path, streams):
    server = lockd_factory(f"sqlite:///{tmp_path}/lockd.db",
                           env={"LOCKD_MAX_EVENT_STREAMS": "8",
                                "LOCKD_API_KEYS": f"{KEY_A},{KEY_B}"})
    url, run = server.url, uuid.uuid4().hex[:8]
    answers: list[httpx.Response] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def open_one(i: int) -> None:
        barrier.wait()
        response = streams.open(url + _paths(run)[i % 4], KEY_A)
        with lock:
            answers.append(response)

    threads = [threading.Thread(target=open_one, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    statuses = sorted(r.status_code for r in answers)
    assert statuses == [200, 200] + [429] * 6, statuses  # a quarter of 8, all kinds together
    for refused in (r for r in answers if r.status_code == 429):
        body = assert_problem(refused, 429, "too_many_identity_streams")
        assert body["limit"] == 2 and int(refused.headers["Retry-After"]) >= 1
    # another identity still gets its share
    assert [streams.open(url + p, KEY_B).status_code for p in _paths(run)] == [200, 200, 429, 429]


def test_stream_slots_count_in_total_and_per_identity():
    slots = StreamSlots(10)
    assert slots.share == 3  # a quarter, rounded up
    assert [slots.take("a") for _ in range(4)] == [None, None, None, "identity"]
    assert [slots.take(None) for _ in range(8)] == [None] * 7 + ["total"]  # no identity: total
    slots.give_back("a")
    assert slots.take("b") is None and slots.take("a") == "total"
    assert slots.open == 10 and StreamSlots(1).share == 1 and StreamSlots(0).take(None) == "total"
