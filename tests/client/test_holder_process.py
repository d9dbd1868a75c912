"""The fencing race for real: a holder process frozen with SIGSTOP past its TTL.

Timeline: A acquires (fence f1) and writes; A is frozen; lockd expires A; B acquires (f2 > f1)
and writes; A is thawed. A's client must report the loss (event set, callback once), and A's
next write must be rejected by the proxy with ``StaleTokenError(presented=f1, highest=f2)``,
leaving B's row as it was.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from lockd import FencedSession, LockClient

HOLDER = Path(__file__).with_name("holder_proc.py")


def test_frozen_holder_reports_lost_and_its_late_write_is_stale(shared_lockd, proxy):
    ttl = 1.0
    with FencedSession(proxy.url) as lookup:
        name = lookup.lock_for("items", 1)  # the one lock that writes row 1
    holder = subprocess.Popen(
        [sys.executable, str(HOLDER), shared_lockd.url, proxy.url, name, str(ttl)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready", holder.stderr.read()
        holder.send_signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        with LockClient(shared_lockd.url) as b_client:
            # B waits for lockd to expire A's lease (about ttl after A's last renewal).
            b = b_client.acquire(name, 5.0, wait=5.0)
            assert time.monotonic() - frozen_at < ttl + 1.0
            with FencedSession(proxy.url, b) as db:
                db.upsert("items", 1, {"id": 1, "owner": "B", "n": b.fence})
            holder.send_signal(signal.SIGCONT)
            out, err = holder.communicate(timeout=20)
            b_client.release(b)
    finally:
        if holder.poll() is None:
            holder.send_signal(signal.SIGCONT)
            holder.kill()
    report = json.loads(out.strip().splitlines()[-1])
    assert report["lost_event"] is True, err
    assert report["state"] == "lost"
    assert report["reason"] in ("local_deadline", "lease_lost")
    assert report["callbacks"] == 1
    assert report["known_loss"] == "refused"  # known lost: refused before any request
    assert report["late_write"] == "stale"
    assert report["presented"] == report["fence"] < b.fence == report["highest"]
    assert report["exit"] == "LeaseLostError"  # the block finished on a lost lease
    assert proxy.rows("items")[0][:2] == (1, "B")  # A's late write changed nothing
