"""An election candidate run as its own process by ``test_elections`` (so it can be killed with
SIGKILL or frozen with SIGSTOP while it leads).

Usage: ``python election_candidate.py LOCKD_URL NAME OWNER TTL_MS``

It campaigns (waiting up to two minutes), prints ``{"event": "elected", "fence", "at"}`` once
elected, then renews every quarter TTL and prints ``{"event": "renew", "sent", "status"}`` for
each renewal (``sent``: ``time.monotonic()`` before the request, comparable with the test's own:
one system-wide clock). The first renewal that is not 200 ends it. Plain HTTP, no client library.
"""

from __future__ import annotations

import json
import sys
import time

import httpx


def main() -> None:
    url, name, owner, ttl_ms = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    with httpx.Client(timeout=150) as http:
        r = http.post(f"{url}/v1/elections/{name}/campaign",
                      json={"ttl_ms": ttl_ms, "wait_ms": 120_000, "owner": owner,
                            "value": f"value of {owner}"})
        if r.status_code != 200:
            print(json.dumps({"event": "refused", "status": r.status_code}), flush=True)
            return
        lease = r.json()
        print(json.dumps({"event": "elected", "fence": lease["fence"], "at": time.monotonic()}),
              flush=True)
        while True:
            time.sleep(ttl_ms / 4000)  # renewal pacing: every quarter of the TTL (a leader's rhythm)
            sent = time.monotonic()
            r = http.post(f"{url}/v1/elections/{name}/renew", json={"lease_id": lease["lease_id"]})
            print(json.dumps({"event": "renew", "sent": sent, "status": r.status_code}),
                  flush=True)
            if r.status_code != 200:
                return


if __name__ == "__main__":
    main()
