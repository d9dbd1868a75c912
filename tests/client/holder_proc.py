"""A lock holder run as its own process by ``test_holder_process``.

Usage: ``python holder_proc.py LOCKD_URL PROXY_URL LOCK TTL_SECONDS``

It acquires LOCK with ``LockClient``, writes row 1 of ``items`` through ``FencedSession``, prints
``ready`` and then blocks until its lease is reported lost (the test freezes it with SIGSTOP past
its TTL meanwhile). Once lost, it tries one more write and prints, as one JSON line, everything
it observed: the event, the callback count, the state, whether the client refused the write
itself (it knows the lease is lost) and what the proxy said to the same write sent anyway
(``refuse_lost=False``).
"""

from __future__ import annotations

import json
import sys

from lockd import FencedSession, LeaseLostError, LockClient, StaleTokenError


def main() -> None:
    lockd_url, proxy_url, name, ttl = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    report: dict = {"callbacks": 0}

    def on_lost(lease) -> None:
        report["callbacks"] += 1

    client = LockClient(lockd_url)
    try:
        with client.lock(name, ttl=ttl, on_lost=on_lost) as lease:
            db = FencedSession(proxy_url, lease)
            db.upsert("items", 1, {"id": 1, "owner": "A", "n": lease.fence})
            report["fence"] = lease.fence
            print("ready", flush=True)
            report["lost_event"] = lease.lost.wait(30)
            report["state"] = lease.state.value
            report["reason"] = lease.lost_reason.code if lease.lost_reason else None
            try:  # the client knows the lease is lost: it refuses before sending
                db.upsert("items", 1, {"id": 1, "owner": "A-late", "n": lease.fence})
                report["known_loss"] = "accepted"
            except LeaseLostError:
                report["known_loss"] = "refused"
            try:  # the pure fencing rule (as if the client did not know): the proxy decides
                pure = FencedSession(proxy_url, lease, refuse_lost=False)
                pure.upsert("items", 1, {"id": 1, "owner": "A-late", "n": lease.fence})
                report["late_write"] = "accepted"
            except StaleTokenError as exc:
                report.update(late_write="stale", presented=exc.presented, highest=exc.highest)
    except LeaseLostError:
        report["exit"] = "LeaseLostError"
    finally:
        client.close()
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
