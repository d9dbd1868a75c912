"""Event streams: 300 subscribers that never read cannot slow lockd down.

Measured, not asserted (printed in the test output): lockd's CPU per acquire+release with no
subscriber, then with 300 event streams whose clients never read a byte. Asserted: the stream
cap answers 503 ``too_many_streams`` with ``Retry-After``, each stalled subscriber is dropped
(not buffered: ``lockd_event_streams`` falls to 0 and ``lockd_events_dropped_total`` counts
them) and its connection is closed, and then a new stream is accepted again.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import httpx

from harness import free_port, wait_for
from harness.servers import LockdServer
from tests.server.calls import assert_problem
from tests.system.ops.conftest import scrape

SUBSCRIBERS = 300
CYCLES = 1000
_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime


def _cycles(http: httpx.Client, url: str, pid: int, n: int) -> float:
    """lockd's CPU milliseconds per acquire+release, over ``n`` cycles."""
    before = _cpu_seconds(pid)
    for i in range(n):
        lock = f"sse/cycle-{i % 10}"
        lease = http.post(f"{url}/v1/locks/{lock}/acquire", json={"ttl_ms": 5000}).json()
        r = http.post(f"{url}/v1/locks/{lock}/release", json={"lease_id": lease["lease_id"]})
        assert r.status_code == 200, r.text
    return (_cpu_seconds(pid) - before) * 1000 / n


def _idle_subscriber(port: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a client that never reads
    s.connect(("127.0.0.1", port))
    s.sendall(b"GET /v1/events HTTP/1.1\r\nHost: x\r\n\r\n")
    return s


def _closed_by_server(s: socket.socket) -> bool:
    """Whether lockd closed ``s`` (drains what was buffered, never blocks)."""
    s.setblocking(False)
    try:
        while True:
            if not s.recv(1 << 20):
                return True
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


def test_idle_subscribers_are_capped_dropped_and_cheap(tmp_path: Path, capsys):
    lockd = LockdServer(f"sqlite:///{tmp_path}/e.db", key_dir=tmp_path / "keys", log_dir=tmp_path,
                        port=free_port(),
                        env={"LOCKD_MAX_EVENT_STREAMS": str(SUBSCRIBERS),
                             "LOCKD_WRITE_TIMEOUT_MS": "2000"}).start()
    subscribers: list[socket.socket] = []
    try:
        with httpx.Client(timeout=10) as http:
            _cycles(http, lockd.url, lockd.proc.pid, 50)  # warm up
            unloaded = _cycles(http, lockd.url, lockd.proc.pid, CYCLES)

            subscribers = [_idle_subscriber(lockd.port) for _ in range(SUBSCRIBERS)]
            wait_for(lambda: scrape(lockd.url).value("lockd_event_streams") == SUBSCRIBERS,
                     timeout=10, what="300 open streams")
            over = http.get(f"{lockd.url}/v1/events")
            assert_problem(over, 503, "too_many_streams")
            assert int(over.headers["retry-after"]) > 0

            loaded = _cycles(http, lockd.url, lockd.proc.pid, CYCLES)
            # Every stalled subscriber fell queue_size events behind: dropped, not buffered.
            wait_for(lambda: scrape(lockd.url).value("lockd_event_streams") == 0,
                     timeout=15, what="stalled streams dropped")
            assert scrape(lockd.url).value("lockd_events_dropped_total") >= SUBSCRIBERS
            wait_for(lambda: all(_closed_by_server(s) for s in subscribers), timeout=15,
                     what="stalled connections closed")
            with http.stream("GET", f"{lockd.url}/v1/events") as again:
                assert again.status_code == 200
    finally:
        for s in subscribers:
            s.close()
        log = lockd.log()
        lockd.stop()
    with capsys.disabled():
        print(f"\nlockd CPU per acquire+release ({CYCLES} cycles): {unloaded:.2f} ms with no "
              f"subscriber, {loaded:.2f} ms with {SUBSCRIBERS} subscribers that never read "
              f"({loaded / unloaded:.2f}x)")
    assert "Traceback" not in log
