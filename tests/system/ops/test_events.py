"""The SSE event streams: acquired, released and expired events in order with their fences,
per lock and per prefix, heartbeats, bounded queues (drop + overflow signal), ``lockctl watch``,
force-release events, and streams that do not hold up a clean stop."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import threading
import time

import httpx
import pytest

from harness import VENV_BIN, wait_for
from lockd.server.events import EventHub


class StreamReader(threading.Thread):
    """Reads an SSE stream in the background: ``events`` (parsed), ``comments``, ``raw``."""

    def __init__(self, url: str, headers: dict[str, str] | None = None):
        super().__init__(daemon=True)
        self.url, self.headers = url, headers or {}
        self.events: list[tuple[str, dict]] = []
        self.comments: list[str] = []
        self.raw: list[str] = []
        self.connected = threading.Event()
        self.status: int | None = None

    def run(self) -> None:
        kind, data = "message", ""
        try:
            with httpx.stream("GET", self.url, headers=self.headers,
                              timeout=httpx.Timeout(10, read=None)) as response:
                self.status = response.status_code
                assert response.headers["content-type"].startswith("text/event-stream")
                for line in response.iter_lines():
                    self.raw.append(line)
                    if line.startswith(":"):
                        self.comments.append(line)
                        if "connected" in line:
                            self.connected.set()
                    elif line.startswith("event: "):
                        kind = line[7:]
                    elif line.startswith("data: "):
                        data = line[6:]
                    elif not line and data:
                        self.events.append((kind, json.loads(data)))
                        kind, data = "message", ""
        except httpx.HTTPError:
            pass
        finally:
            self.connected.set()

    def start_and_wait(self) -> StreamReader:
        self.start()
        assert self.connected.wait(10)
        assert self.status == 200
        return self


def _acquire(url: str, name: str, ttl_ms: int) -> dict:
    response = httpx.post(f"{url}/v1/locks/{name}/acquire", json={"ttl_ms": ttl_ms,
                                                                  "owner": "tester"})
    assert response.status_code == 200, response.text
    return response.json()


def _release(url: str, name: str, lease: dict) -> None:
    response = httpx.post(f"{url}/v1/locks/{name}/release", json={"lease_id": lease["lease_id"]})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_stream_delivers_acquired_released_expired_in_order(store, start_lockd, name):
    lockd = start_lockd(store, env={"LOCKD_EVENTS_HEARTBEAT_MS": "150"})
    stream = StreamReader(f"{lockd.url}/v1/locks/{name}/events").start_and_wait()
    everything = StreamReader(f"{lockd.url}/v1/events?prefix=ops/").start_and_wait()
    first = _acquire(lockd.url, name, 5000)
    _release(lockd.url, name, first)
    second = _acquire(lockd.url, name, 300)  # never released: it expires
    wait_for(lambda: len(stream.events) >= 4, timeout=5, what="the expired event")
    other = _acquire(lockd.url, name + "-other", 5000)  # another lock: not on this stream
    third = _acquire(lockd.url, name, 5000)
    _release(lockd.url, name, third)
    wait_for(lambda: len(stream.events) >= 6, timeout=5, what="six events")
    time.sleep(0.2)  # proves: no seventh event (the other lock's) follows within 200 ms
    got = [(kind, data["type"], data["fence"]) for kind, data in stream.events]
    assert got == [
        ("acquired", "acquired", first["fence"]), ("released", "released", first["fence"]),
        ("acquired", "acquired", second["fence"]), ("expired", "expired", second["fence"]),
        ("acquired", "acquired", third["fence"]), ("released", "released", third["fence"]),
    ]
    assert first["fence"] < second["fence"] < third["fence"]
    ids = [data["id"] for _, data in stream.events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    acquired = stream.events[0][1]
    assert acquired["lock"] == name and acquired["owner"] == "tester"
    assert acquired["ttl_ms"] == 5000 and isinstance(acquired["at"], int)
    text = "\n".join(stream.raw + everything.raw)
    for lease in (first, second, third, other):  # never a secret on the wire
        assert lease["lease_id"] not in text and lease["token"] not in text
    assert ": keepalive" in stream.comments  # idle while the 300 ms lease ran out
    prefixed = {(d["lock"], d["type"], d["fence"]) for _, d in everything.events}
    assert (name + "-other", "acquired", other["fence"]) in prefixed
    assert (name, "expired", second["fence"]) in prefixed
    started = time.monotonic()
    assert lockd.stop() == 0  # open streams end at SIGTERM instead of holding up the stop
    assert time.monotonic() - started < 5
    stream.join(5)
    assert not stream.is_alive()


def test_history_replay_and_last_event_id(start_lockd, name):
    lockd = start_lockd("sqlite")
    leases = [_acquire(lockd.url, name, 5000)]
    _release(lockd.url, name, leases[0])
    leases.append(_acquire(lockd.url, name, 5000))
    replay = StreamReader(f"{lockd.url}/v1/locks/{name}/events?history=2").start_and_wait()
    wait_for(lambda: len(replay.events) >= 2, timeout=5, what="replayed history")
    assert [(k, d["fence"]) for k, d in replay.events] == [
        ("released", leases[0]["fence"]), ("acquired", leases[1]["fence"])]
    first_id = replay.events[0][1]["id"]
    resumed = StreamReader(f"{lockd.url}/v1/locks/{name}/events",
                           headers={"Last-Event-ID": str(first_id)}).start_and_wait()
    wait_for(lambda: len(resumed.events) >= 1, timeout=5, what="resumed events")
    assert [(k, d["id"]) for k, d in resumed.events] == [("acquired", first_id + 1)]
    bad = httpx.get(f"{lockd.url}/v1/locks/{name}/events?history=9999")
    assert bad.status_code == 422 and bad.json()["code"] == "invalid_request"
    bad = httpx.get(f"{lockd.url}/v1/events?prefix=no%20spaces")
    assert bad.status_code == 422


def test_force_release_event_and_next_fence(start_lockd, name):
    lockd = start_lockd("sqlite", env={"LOCKD_ADMIN_KEYS": "admin-key-0123456789"})
    stream = StreamReader(f"{lockd.url}/v1/locks/{name}/events").start_and_wait()
    lease = _acquire(lockd.url, name, 60_000)
    forced = httpx.post(f"{lockd.url}/v1/locks/{name}/force-release",
                        headers={"Authorization": "Bearer admin-key-0123456789"})
    assert forced.status_code == 200
    assert forced.json() == {"lock": name, "released": True, "fence": lease["fence"],
                             "owner": "tester"}
    again = httpx.post(f"{lockd.url}/v1/locks/{name}/force-release",
                       headers={"Authorization": "Bearer admin-key-0123456789"})
    assert again.json()["released"] is False
    renew = httpx.post(f"{lockd.url}/v1/locks/{name}/renew", json={"lease_id": lease["lease_id"]})
    assert renew.status_code == 410
    nxt = _acquire(lockd.url, name, 5000)
    assert nxt["fence"] > lease["fence"]
    wait_for(lambda: len(stream.events) >= 3, timeout=5, what="three events")
    released = stream.events[1][1]
    assert released["type"] == "released" and released["forced"] is True
    assert released["fence"] == lease["fence"]
    assert stream.events[2][1]["type"] == "acquired"
    metrics = httpx.get(f"{lockd.url}/metrics").text
    assert 'lockd_releases_total{kind="forced"} 1.0' in metrics
    assert 'lockd_lease_hold_seconds_count{outcome="forced"} 1.0' in metrics
    assert "lockd_lease_expirations_total 0.0" in metrics  # forced is not an expiry


def test_lockctl_watch(start_lockd, name):
    lockd = start_lockd("sqlite")
    lockctl = str(VENV_BIN / "lockctl")
    as_json = subprocess.Popen([lockctl, "--url", lockd.url, "--json", "watch", name],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    human = subprocess.Popen([lockctl, "--url", lockd.url, "watch", "--prefix", name],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: httpx.get(f"{lockd.url}/metrics").text.count(
            "lockd_event_streams 2.0") == 1, timeout=10, what="both watchers connected")
        lease = _acquire(lockd.url, name, 5000)
        _release(lockd.url, name, lease)
        assert as_json.stdout is not None and human.stdout is not None
        lines = [json.loads(as_json.stdout.readline()) for _ in range(2)]
        text = [human.stdout.readline() for _ in range(2)]
    finally:
        for proc in (as_json, human):
            proc.send_signal(signal.SIGINT)
    assert [(e["type"], e["fence"]) for e in lines] == [("acquired", lease["fence"]),
                                                        ("released", lease["fence"])]
    assert all("lease_id" not in e and "token" not in e for e in lines)
    assert "acquired" in text[0] and f"fence {lease['fence']}" in text[0] and name in text[0]
    assert "owner 'tester'" in text[0] and "ttl 5s" in text[0]
    assert "released" in text[1]
    assert as_json.wait(10) == 0 and human.wait(10) == 0


def test_slow_client_is_dropped_and_told():
    """A stream whose client does not read: its queue (size 3) fills, the next matching event
    DROPS the stream (counted once; publish stops paying for it): the client gets what was
    queued, then an overflow event, then the stream ends. Publish never blocks; each event is
    serialised once (the same bytes object reaches every stream)."""

    async def scenario() -> tuple[bytes, int, int]:
        dropped = []
        hub = EventHub(queue_size=3, on_drop=lambda: dropped.append(1), flush_s=0.01)
        stream = hub.stream(lambda lock: lock == "a", heartbeat_s=0.05)
        assert (await anext(stream)).startswith(b"retry:")
        for fence in range(1, 9):
            hub.publish("acquired", "a", fence, "o", 1000)
            hub.publish("acquired", "b", fence, "o", 1000)  # not matched: never queued
        assert hub.streams == 0
        chunks = [c async for c in stream]
        return b"".join(chunks), len(dropped), hub.streams

    data, dropped, streams = asyncio.run(scenario())
    assert dropped == 1 and streams == 0
    events = [e for e in data.split(b"\n\n") if e and not e.startswith(b":")]
    assert [e.split(b"\n")[1] for e in events[:3]] == [b"event: acquired"] * 3
    assert [json.loads(e.split(b"data: ")[1])["fence"] for e in events[:3]] == [1, 2, 3]
    assert events[3] == b'event: overflow\ndata: {"dropped": 1}'
    assert len(events) == 4


def test_an_event_is_serialised_once_for_all_streams():
    async def scenario() -> list[bytes]:
        hub = EventHub(flush_s=0)
        streams = [hub.stream(lambda lock: True) for _ in range(3)]
        for s in streams:
            await anext(s)
        event = hub.publish("acquired", "a", 1, "o", 1000)
        got = [await anext(s) for s in streams]
        assert all(chunk is event.wire for chunk in got), "re-serialised per stream"
        hub.close()
        return got

    assert len(set(asyncio.run(scenario()))) == 1
