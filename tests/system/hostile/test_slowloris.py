"""Time and number of connections: a slowloris flood does not take lockd down.

lockd runs under a low descriptor limit (``prlimit --nofile``) as in the review that found the
problem. Three waves of 200 half-open connections (a third idle, a third with half their headers,
a third with a full header and half a body) arrive while a holder renews its lease every 0.5 s,
each renewal on a NEW connection (as a holder behind a load balancer, or ``lockctl``, does).
Without bounds the flood takes every descriptor and keeps it: renewals cannot even connect and
the lease is lost. With them, lockd closes each half-open connection once
``request_timeout_ms`` has passed, answers the connections beyond ``max_connections`` with 503
``overloaded`` + ``Retry-After`` (the client library retries), and the holder never loses its
lease.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from pathlib import Path

import httpx

from harness import free_port
from harness.servers import LockdServer
from lockd.client import LockClient
from tests.jitter import hold_sync

NOFILE = 200
REQUEST_TIMEOUT_MS = 1000
MAX_CONNECTIONS = 120
FLOOD = 200
WAVES = 3


def _limited_lockd(store_url: str, tmp_path: Path, **kwargs) -> LockdServer:
    """``lockd serve`` with at most ``NOFILE`` open descriptors."""
    return LockdServer(store_url, log_dir=tmp_path, key_dir=tmp_path / "keys",
                       wrapper=["prlimit", f"--nofile={NOFILE}:{NOFILE}", "--"], **kwargs)


def _half_open(port: int, kind: int) -> socket.socket | None:
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
    except OSError:
        return None
    s.setblocking(False)
    try:
        if kind == 1:  # half the headers
            s.send(b"POST /v1/locks/x/acquire HTTP/1.1\r\nHost: x\r\nContent-Ty")
        elif kind == 2:  # whole headers, half the body
            s.send(b"POST /v1/locks/x/acquire HTTP/1.1\r\nHost: x\r\n"
                   b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"ttl_")
    except OSError:
        pass
    return s  # kind 0: idle, never sends a byte


class _Flood:
    """Waves of half-open connections; records when the server closed each, and any 503s."""

    def __init__(self, port: int):
        self.port = port
        self.sel = selectors.DefaultSelector()
        self.opened: dict[socket.socket, float] = {}
        self.lifetimes: list[float] = []
        self.answers: list[bytes] = []
        self.refused_connects = 0

    def wave(self) -> None:
        for i in range(FLOOD):
            s = _half_open(self.port, i % 3)
            if s is None:
                self.refused_connects += 1
                continue
            self.opened[s] = time.monotonic()
            self.sel.register(s, selectors.EVENT_READ, bytearray())

    def pump(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if not self.opened:
                hold_sync(None, 0.05)  # an idle tick of the attack's pump
                continue
            for key, _ in self.sel.select(timeout=0.05):
                s, buf = key.fileobj, key.data
                try:
                    chunk = s.recv(65536)
                except (ConnectionResetError, BlockingIOError):
                    chunk = b""
                if chunk:
                    buf += chunk
                    continue
                self.lifetimes.append(time.monotonic() - self.opened.pop(s))
                if buf:
                    self.answers.append(bytes(buf))
                self.sel.unregister(s)
                s.close()

    def close(self) -> int:
        left = len(self.opened)
        for s in list(self.opened):
            self.sel.unregister(s)
            s.close()
        self.opened.clear()
        return left


def test_half_open_flood_never_costs_a_live_holder_its_lease(tmp_path: Path, capsys):
    lockd = _limited_lockd(f"sqlite:///{tmp_path}/s.db", tmp_path,
                          port=free_port(),
                          env={"LOCKD_REQUEST_TIMEOUT_MS": str(REQUEST_TIMEOUT_MS),
                               "LOCKD_MAX_CONNECTIONS": str(MAX_CONNECTIONS)}).start()
    fresh = httpx.Client(timeout=3.0, limits=httpx.Limits(max_keepalive_connections=0))
    client = LockClient(lockd.url, timeout=3.0, http_client=fresh)
    renewals: list[float] = []
    flood = _Flood(lockd.port)
    try:
        lease = client.acquire("slowloris/holder", 4.0, renew_every=0.5)
        fence = lease.fence
        stop = threading.Event()

        def watch_renewals() -> None:  # the local deadline moves on every successful renewal
            last = lease.deadline
            while not stop.wait(0.05):
                if lease.deadline != last:
                    renewals.append(time.monotonic())
                    last = lease.deadline

        watcher = threading.Thread(target=watch_renewals, daemon=True)
        watcher.start()
        started = time.monotonic()
        for _ in range(WAVES):
            flood.wave()
            flood.pump(2.0)
        left_open = flood.close()
        stop.set()
        watcher.join(5)
        elapsed = time.monotonic() - started

        assert not lease.is_lost(), "the holder lost its lease during the flood"
        gaps = [b - a for a, b in zip([started, *renewals], renewals, strict=False)]
        renewed = client.renew(lease)
        assert renewed.fence == fence
        client.release(lease)
    finally:
        flood.close()
        client.close()
        fresh.close()
        log = lockd.log()
        lockd.stop()

    closed = flood.lifetimes
    overloaded = [a for a in flood.answers if a.startswith(b"HTTP/1.1 503")]
    with capsys.disabled():
        print(f"\nslowloris: {WAVES} waves of {FLOOD} half-open connections in {elapsed:.1f} s under "
              f"nofile={NOFILE}: {len(closed)} closed by lockd (longest open "
              f"{max(closed, default=0):.2f} s), {len(overloaded)} answered 503 overloaded, "
              f"{flood.refused_connects} connects refused, {left_open} still open at the end; "
              f"holder renewed {len(renewals)} times, longest gap {max(gaps, default=0):.2f} s "
              "(TTL 4 s)")
    assert left_open == 0, "half-open connections outlived request_timeout_ms"
    assert len(renewals) >= 6, renewals
    assert max(closed) < REQUEST_TIMEOUT_MS / 1000 + 1.5
    assert overloaded and all(b"retry-after: 1" in a.lower() for a in overloaded)
    assert all(b"overloaded" in a for a in overloaded)
    assert "Traceback" not in log


def test_a_cap_above_the_descriptor_limit_is_warned_at_start(tmp_path: Path):
    """A ``max_connections`` the descriptor limit cannot honour is named in the start log."""
    lockd = _limited_lockd(f"sqlite:///{tmp_path}/w.db", tmp_path,
                          port=free_port(), env={"LOCKD_MAX_CONNECTIONS": "1000"}).start()
    lockd.stop()
    assert "max_connections (1000) leaves fewer than 64 of the 200 file descriptors" in lockd.log()
