"""The ``lockctl object`` subcommands: files as fenced objects through the proxy.

::

    lockctl object put BUCKET KEY FILE [--proxy URL] [--lock NAME] [--ttl 30s] [--wait 10s]
                                      [--content-type TYPE]
    lockctl object get BUCKET KEY [FILE] [--proxy URL]
    lockctl object ls BUCKET [--prefix P] [--proxy URL]

``put`` acquires the object's lock (``--lock``; default the bucket's name, the lock of every
object of a bucket without a policy template), streams FILE (``-``: standard input) to the
proxy under that lease, prints the object's pointer (version, fence, size, sha256) and releases
the lock. A superseded lease is refused by the proxy (409 ``stale_token``, exit 1) and nothing
becomes visible. ``get`` writes the object to FILE (default or ``-``: standard output), with no
lease (an unfenced read). ``ls`` lists keys. The proxy is ``--proxy`` or ``$LOCKD_PROXY_URL``
(default ``http://127.0.0.1:7071``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from lockd.client.fenced import FencedSession
from lockd.client.lockctl_common import EXIT_OK, Out, default_owner, duration

__all__ = ["add_commands", "dispatch", "DEFAULT_PROXY"]

DEFAULT_PROXY = "http://127.0.0.1:7071"


def add_commands(add: Callable[[str, str], argparse.ArgumentParser],
                 common: argparse.ArgumentParser) -> None:
    """Add ``object put|get|ls`` with lockctl's ``add(name, help)``."""
    obj = add("object", "fenced files through the proxy: object put|get|ls BUCKET ...")
    sub = obj.add_subparsers(dest="object_cmd", required=True, metavar="OBJECT_COMMAND")

    def obj_add(name: str, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help_, description=help_)
        p.add_argument("--proxy", default=None,
                       help=f"the proxy's URL (default: $LOCKD_PROXY_URL or {DEFAULT_PROXY})")
        return p

    p = obj_add("put", "write FILE as object BUCKET/KEY under a lease of its lock")
    p.add_argument("bucket")
    p.add_argument("object_key", metavar="KEY")
    p.add_argument("file", help="the file to send; '-': standard input")
    p.add_argument("--lock", default=None, help="the object's lock (default: the bucket's name)")
    p.add_argument("--ttl", type=duration, default=30.0, help="lease time to live (default 30s)")
    p.add_argument("--wait", type=duration, default=0.0,
                   help="how long to wait for the lock (default 0: try once)")
    p.add_argument("--content-type", default=None, help="default application/octet-stream")
    p = obj_add("get", "read object BUCKET/KEY into FILE (default: standard output)")
    p.add_argument("bucket")
    p.add_argument("object_key", metavar="KEY")
    p.add_argument("file", nargs="?", default="-")
    p = obj_add("ls", "list the objects of BUCKET")
    p.add_argument("bucket")
    p.add_argument("--prefix", default="")


def _proxy(args: argparse.Namespace) -> str:
    return (args.proxy or os.environ.get("LOCKD_PROXY_URL") or DEFAULT_PROXY).rstrip("/")


def dispatch(client: Any, args: argparse.Namespace, out: Out) -> int:
    """Run ``object put|get|ls``; returns the exit status (errors raise ``LockClientError``)."""
    proxy = _proxy(args)
    if args.object_cmd == "put":
        lease = client.acquire(args.lock or args.bucket, args.ttl, wait=args.wait,
                               owner=default_owner())
        try:
            with FencedSession(proxy, lease) as db:
                source = sys.stdin.buffer if args.file == "-" else args.file
                made = db.put_object(args.bucket, args.object_key, source,
                                     content_type=args.content_type)
        finally:
            client.release(lease)
        out.emit(made, f"wrote {args.bucket}/{args.object_key}  version {made['version']}  fence "
                       f"{made['fence']}  {made['size']} bytes  sha256 {made['sha256']}")
        return EXIT_OK
    with FencedSession(proxy) as db:
        if args.object_cmd == "get":
            if args.file == "-":
                db.get_object(args.bucket, args.object_key, into=sys.stdout.buffer, fenced=False)
                sys.stdout.buffer.flush()
            else:
                count = db.get_object(args.bucket, args.object_key, into=args.file, fenced=False)
                print(f"read {args.bucket}/{args.object_key} into {args.file} ({count} bytes)",
                      file=sys.stderr)
            return EXIT_OK
        items = db.list_objects(args.bucket, args.prefix)
        out.emit({"items": items}, "\n".join(
            f"{i['key']}  {i['size']}  v{i['version']}  fence {i['fence']}" for i in items)
            or "(no objects)")
        return EXIT_OK
