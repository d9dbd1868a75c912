"""End to end with a real ``lockd serve``: its leases' tokens fence the proxy's tables.

The proxy gets lockd's keys from ``--lockd-url``; a holder whose lease was released (or lost)
and re-granted to someone else is refused with 409 once the new holder has written or claimed.
"""

from __future__ import annotations

import httpx

from harness.servers import LockdServer
from tests.proxy.conftest import assert_problem, make_database, unique


def test_lockd_tokens_fence_the_proxy(tmp_path, start_proxy):
    lockd = LockdServer(f"sqlite:///{tmp_path / 'lockd.db'}", log_dir=tmp_path)
    lockd_url = lockd.url
    db = make_database("sqlite", tmp_path, None)
    with lockd:
        proxy_url, _ = start_proxy(db.url, "--lockd-url", lockd_url)
        lock, key = "items", unique()  # no policy: table items is written under lock items
        with httpx.Client(base_url=lockd_url) as locks, httpx.Client(base_url=proxy_url) as proxy:
            first = locks.post(f"/v1/locks/{lock}/acquire", json={"ttl_ms": 30_000, "owner": "a"}).json()
            path = f"/v1/tables/items/rows/{key}"
            write = proxy.put(path, json={"v": "a"}, headers={"Fencing-Token": first["token"]})
            assert write.status_code == 200, write.text
            released = locks.post(f"/v1/locks/{lock}/release", json={"lease_id": first["lease_id"]})
            assert released.status_code == 200

            second = locks.post(f"/v1/locks/{lock}/acquire", json={"ttl_ms": 30_000, "owner": "b"}).json()
            assert second["fence"] > first["fence"]
            claim = proxy.post(f"/v1/fences/{lock}/claim", headers={"Fencing-Token": second["token"]})
            assert claim.json() == {"lock": lock, "highest": second["fence"]}

            late = proxy.put(path, json={"v": "a-again"}, headers={"Fencing-Token": first["token"]})
            problem = assert_problem(late, 409, "stale_token")
            assert (problem["presented"], problem["highest"]) == (first["fence"], second["fence"])
            assert proxy.get(path).json()["v"] == "a"
