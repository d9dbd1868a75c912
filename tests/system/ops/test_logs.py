"""What both servers log at the default level (info), read from real processes' logs: the
proxy one line per refused stale write (lock, presented and highest fence, never the token),
lockd one line per lease expiry it observes, no third-party per-request lines (httpx fetching
lockd's keys), and a "stopping" line from each on SIGTERM."""

from __future__ import annotations

import httpx

from harness import wait_for


def _acquire(url: str, name: str, ttl_ms: int, owner: str) -> dict:
    answer = httpx.post(f"{url}/v1/locks/{name}/acquire", json={"ttl_ms": ttl_ms, "owner": owner},
                        timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _lines(log: str, needle: str) -> list[str]:
    return [line for line in log.splitlines() if needle in line]


def test_default_level_logs_stale_writes_expiries_and_stops(start_lockd, start_proxy):
    name = "items/k1"  # the lock of row k1 (policy items/{key})
    lockd = start_lockd("sqlite")
    proxy = start_proxy(lockd)
    row = f"{proxy.url}/v1/tables/items/rows/k1"
    old = _acquire(lockd.url, name, 300, "worker-old")
    assert httpx.put(row, json={"id": "k1", "v": "old"},
                     headers={"Fencing-Token": old["token"]}).status_code == 200
    wait_for(lambda: not httpx.get(f"{lockd.url}/v1/locks/{name}").json()["held"], timeout=5,
             what="the old lease to expire unrenewed")
    new = _acquire(lockd.url, name, 5000, "worker-new")
    assert httpx.put(row, json={"id": "k1", "v": "new"},
                     headers={"Fencing-Token": new["token"]}).status_code == 200
    stale = httpx.put(row, json={"id": "k1", "v": "revived"},
                      headers={"Fencing-Token": old["token"]})
    assert stale.status_code == 409

    wait_for(lambda: _lines(lockd.log(), "lease expired"), timeout=5, what="the expiry logged")
    expired = _lines(lockd.log(), "lease expired")
    assert len(expired) == 1, lockd.log()
    assert expired[0].endswith(f"lease expired: lock 'items/k1', fence {old['fence']}, owner "
                               "'worker-old' (TTL 300 ms, not renewed in time)"), expired
    assert " INFO " in expired[0]

    refused = _lines(proxy.log(), "refused stale")
    assert len(refused) == 1, proxy.log()
    assert refused[0].endswith(
        f"refused stale PUT /v1/tables/items/rows/k1: fence {old['fence']} for lock 'items/k1' is "
        f"below the highest honoured fence {new['fence']}"), refused
    assert old["token"] not in proxy.log() and "eyJ" not in proxy.log()
    assert not _lines(proxy.log(), "HTTP Request") and not _lines(proxy.log(), " httpx"), \
        proxy.log()

    assert proxy.stop() == 0 and lockd.stop() == 0
    assert len(_lines(proxy.log(), "resource-proxy stopping (signal SIGTERM)")) == 1, proxy.log()
    assert len(_lines(lockd.log(), "lockd stopping (signal SIGTERM)")) == 1, lockd.log()
