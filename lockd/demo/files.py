"""Scene 4 of the demo, ``file``: a revived holder's output FILE is refused, the new holder's
file stands.

A takes lock ``demo-files`` (the lock of every object of bucket ``demo-files``: no policy
needed), writes its output file ``{run}/report.txt`` through the proxy (``FencedSession.output``)
and is frozen with SIGSTOP past its lease; lockd expires it; B acquires with a higher fence and
writes the same file; A is resumed with SIGCONT and writes its file again with its old token:
the proxy answers 409 ``stale_token`` and B's file is still the one anybody reads.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx

from lockd.demo.scenes import SCENES as ROW_SCENES
from lockd.demo.scenes import STARTUP_TIMEOUT, Director, SceneResult, _fence, _finish, _writes

__all__ = ["BUCKET", "SCENES", "revived_file", "read_file"]

BUCKET = "demo-files"


def read_file(d: Director, key: str) -> dict[str, Any] | None:
    """The object as the proxy serves it: ``{body, fence, version}``, ``None`` if it did not."""
    try:
        r = d.http.get(f"{d.proxy_url}/v1/objects/{BUCKET}/{quote(key, safe='/')}")
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    return {"body": r.text, "fence": int(r.headers["x-object-fence"]),
            "version": int(r.headers["x-object-version"])}


def revived_file(d: Director) -> SceneResult:
    """Scene 4: SIGSTOP past the lease, a new holder writes the file, SIGCONT, the stale file
    write gets 409 and the new holder's file stands."""
    ttl = d.ttl
    s = SceneResult("file", "Revived holder's file: A writes its output file and freezes; B "
                            "acquires and writes the file; A wakes and its file write is refused")
    key = f"{d.run}/report.txt"
    a = d.worker(s.scene, "A", BUCKET, writes=2, work=ttl, object_key=key)
    a_acq = a.wait_event("acquired", STARTUP_TIMEOUT)
    a_w1 = a.wait_event("write", 5) if a_acq else None
    if not s.check("A acquires and writes its file", a_acq is not None and a_w1 is not None,
                   f"fence {_fence(a_acq)}, write {a_w1.http if a_w1 else None}"):
        _finish(d, s, [a], 5)
        return s
    a.signal(signal.SIGSTOP)
    stop = d.note(s.scene, "sigstop", f"SIGSTOP A (pid {a.pid}) after its first file write")
    lapsed = d.poll_lock(BUCKET, lambda st: not st.get("held"), ttl + 5)
    s.check("lockd expires the frozen holder's lease", lapsed is not None)
    b = d.worker(s.scene, "B", BUCKET, wait=5 + ttl, writes=1, object_key=key)
    b_acq = b.wait_event("acquired", STARTUP_TIMEOUT)
    b_w1 = b.wait_event("write", 5) if b_acq else None
    time.sleep(max(0.0, stop.t + ttl + 0.2 - d.timeline.now()))
    a.signal(signal.SIGCONT)
    d.note(s.scene, "sigcont", "SIGCONT A: it writes its output file again with its old token")
    rejected = a.wait_event("write_rejected", 5 + 2 * ttl)
    _finish(d, s, [a, b], 10 + 2 * ttl)
    stale = dict(rejected.data) if rejected else None
    seen = read_file(d, key)
    s.facts.update(fences={"A": _fence(a_acq), "B": _fence(b_acq)}, stale=stale, file=seen,
                   writes={"A": _writes(a), "B": _writes(b)}, key=key)
    s.check("A's first file write is accepted (201)", a_w1.http == "201", a_w1.http or "")
    s.check("B replaces the file with a higher fence (200)",
            b_w1 is not None and b_w1.http == "200" and b_acq is not None
            and b_acq.fence > a_acq.fence, f"{_fence(a_acq)} -> {_fence(b_acq)}")
    s.check("A's file write after waking is rejected: 409 stale_token",
            stale is not None and stale.get("code") == "stale_token"
            and stale.get("presented") == _fence(a_acq) and stale.get("highest") == _fence(b_acq),
            f"presented {stale.get('presented')}, highest {stale.get('highest')}"
            if stale else "A's write was not rejected")
    s.check("the file is B's: its bytes and its fence",
            seen is not None and seen["body"].startswith("B ") and b_acq is not None
            and seen["fence"] == b_acq.fence and seen["version"] == 2,
            f"{seen}" if seen else "the file could not be read")
    return s


SCENES: list[Callable[[Director], SceneResult]] = [*ROW_SCENES, revived_file]
"""Every scene of the demo, in order (``python -m lockd.demo --scene N``)."""
