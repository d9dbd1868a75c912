"""One worker of the ``objects`` chaos workload: take the lock, write versions of ONE object.

``python -m chaos.objwork --lockd URL --proxy URL --bucket B --key K --log FILE --worker N``
loops until SIGTERM: acquire lock ``B`` (the lock of every object of bucket ``B``: no policy),
write the object 1-3 times through the proxy with the lease's token (``FencedSession.
put_object``), thinking before each write, release. Each body is a JSON tag ``{"w", "fence",
"n"}`` padded to 1-16 KiB (half the writes: kept inline in the pointer row, the claim and the
move one statement) or 17-256 KiB (a blob first, so a PUT takes a while: the nemesis finds
PUTs in flight). Half the PUTs, of either size, carry no Idempotency-Key, so on PostgreSQL a
small body's PUT takes the one-statement path (the claim and the move as one transaction). A worker
never checks its lease before writing: the nemesis freezes it (SIGSTOP) past its lease and the
proxy's fence must refuse what it sends when thawed.

Log: one JSON object a line, ``t`` = ``time.monotonic()`` (system-wide on Linux, so the
runner's reader and every worker share one clock): ``acquired {fence}``, ``write {tag, fence,
size}`` before each PUT, then ``ack {tag, fence, version}`` / ``stale {tag, fence, highest}`` /
``unknown {tag, fence, error}`` (no answer: the write may have committed) / ``rejected``.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import time
from typing import Any

from lockd.client import LockClient
from lockd.client.errors import LockClientError, StaleTokenError, TransportError
from lockd.client.fenced import FencedSession

__all__ = ["main", "body_of", "tag_of"]


def body_of(tag: dict[str, Any], size: int) -> bytes:
    """The object body: the tag's JSON on the first line, padding after it."""
    head = json.dumps(tag, sort_keys=True).encode() + b"\n"
    return head + b"." * max(0, size - len(head))


def tag_of(body: bytes) -> dict[str, Any] | None:
    """The tag of a body ``body_of`` made (None if the first line is not one)."""
    try:
        tag = json.loads(body.split(b"\n", 1)[0])
    except ValueError:
        return None
    return tag if isinstance(tag, dict) else None


class _Log:
    def __init__(self, path: str, worker: int):
        self.file = open(path, "a", buffering=1)
        self.worker = worker

    def __call__(self, ev: str, **fields: Any) -> None:
        self.file.write(json.dumps({"t": time.monotonic(), "ev": ev, "w": self.worker,
                                    **fields}) + "\n")


def run(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed * 1000 + args.worker)
    log = _Log(args.log, args.worker)
    stop = False

    def on_term(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    n = 0
    with LockClient(args.lockd, owner=f"objwork-{args.worker}") as client:
        while not stop:
            try:
                lease = client.acquire(args.bucket, args.ttl, wait=2.0)
            except LockClientError as exc:
                log("not_acquired", error=exc.code)
                time.sleep(0.05)
                continue
            log("acquired", fence=lease.fence)
            try:
                # refuse_lost=False: the fence alone decides (what chaos tests), also for a
                # worker that knows its lease lapsed while it was frozen
                with FencedSession(args.proxy, lease, retries=0, timeout=5.0,
                                   refuse_lost=False) as db:
                    for _ in range(rng.randint(1, 3)):
                        # think BEFORE each write, never after the last: a worker frozen while
                        # it holds the lock is most often thinking, and thawed it then always
                        # sends one more write with the token it was frozen with
                        time.sleep(rng.uniform(0.0, 0.2))
                        n += 1
                        tag = {"w": args.worker, "fence": lease.fence, "n": n}
                        size = (rng.randint(1, 16) if rng.random() < 0.5
                                else rng.randint(17, 256)) * 1024
                        log("write", tag=tag, fence=lease.fence, size=size)
                        try:
                            made = db.put_object(args.bucket, args.key, body_of(tag, size),
                                                 idempotent=rng.random() < 0.5)
                        except StaleTokenError as exc:
                            log("stale", tag=tag, fence=lease.fence, highest=exc.highest)
                            break
                        except (TransportError, LockClientError) as exc:
                            kind = ("unknown" if isinstance(exc, TransportError)
                                    or (exc.status or 500) >= 500 else "rejected")
                            log(kind, tag=tag, fence=lease.fence, error=exc.code,
                                status=exc.status)
                            break
                        log("ack", tag=tag, fence=lease.fence, version=made["version"])
            finally:
                try:
                    client.release(lease)
                except LockClientError:
                    pass  # lapsed while frozen: the next acquire gets a higher fence


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chaos.objwork")
    p.add_argument("--lockd", required=True)
    p.add_argument("--proxy", required=True)
    p.add_argument("--bucket", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--worker", type=int, required=True)
    p.add_argument("--ttl", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1)
    run(p.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
