"""A semaphore permit holder run as its own process by ``test_semaphores`` (plain httpx).

Usage: ``python sem_holder_proc.py LOCKD_URL NAME LIMIT TTL_MS``

It acquires one permit (waiting up to 30 s), prints one JSON line (``slot``, ``fence``) and then
renews every TTL/5 until a renewal is refused, printing ``{"lost": status}`` and exiting. The
test kills it (SIGKILL) or freezes it past its TTL (SIGSTOP) meanwhile.
"""

from __future__ import annotations

import json
import sys
import time

import httpx


def main() -> None:
    url, name, limit, ttl_ms = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    with httpx.Client(timeout=10) as http:
        r = http.post(f"{url}/v1/semaphores/{name}/acquire",
                      json={"limit": limit, "ttl_ms": ttl_ms, "wait_ms": 30_000,
                            "owner": f"proc-{sys.argv[5] if len(sys.argv) > 5 else ''}"})
        if r.status_code != 200:
            print(json.dumps({"error": r.status_code}), flush=True)
            return
        permit = r.json()
        print(json.dumps({"slot": permit["slot"], "fence": permit["fence"]}), flush=True)
        while True:
            time.sleep(ttl_ms / 5000)  # renewal pacing: every fifth of the TTL (a holder's rhythm)
            r = http.post(f"{url}/v1/semaphores/{name}/renew",
                          json={"lease_id": permit["lease_id"]})
            if r.status_code != 200:
                print(json.dumps({"lost": r.status_code}), flush=True)
                return


if __name__ == "__main__":
    main()
