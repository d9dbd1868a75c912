"""``lockd keys list | rotate | retire KID [--force]``: key rotation on the key directory.

::

    lockd keys list   [--key-dir DIR]
    lockd keys rotate [--key-dir DIR] [--publish-delay-ms MS]
    lockd keys retire KID [--key-dir DIR] [--max-ttl-ms MS] [--force]

``--key-dir`` defaults to ``LOCKD_KEY_DIR`` (else ``./lockd-keys``), ``--max-ttl-ms`` to
``LOCKD_MAX_TTL_MS`` (else 3600000): give the values the servers run with. ``--publish-delay-ms``
(default 15000) must exceed every replica's ``LOCKD_KEY_RELOAD_MS`` (default 5000) plus the
proxies' ``PROXY_JWKS_REFETCH_INTERVAL_MS`` (default 1000) plus clock skew. What each step does and why retirement waits: ``lockd.server.keydir``. Exit status: 0 done,
1 refused or failed (one line on stderr saying why), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import getpass
import logging
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lockd.server.audit import AuditTrail
from lockd.server.keydir import KeyDirError, list_keys, retire, rotate

__all__ = ["add_parser", "protect_kids", "run"]

# A kid is an RFC 7638 thumbprint: 43 base64url characters, so one in 64 begins with '-', which
# argparse would take for an option. Such an argument is rewritten to ``--kid=KID`` before parsing.
_KID = re.compile(r"-[A-Za-z0-9_-]{42}")

DEFAULT_PUBLISH_DELAY_MS = 15_000
_DEFAULT_MAX_TTL_MS = 3_600_000


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Add ``keys`` and its subcommands to ``lockd``'s parser."""
    keys = commands.add_parser("keys", help="list, rotate or retire signing keys",
                               description="Rotate the token signing keys of a key directory "
                                           "(shared by every replica that uses it).")
    actions = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--key-dir", help="key directory (env LOCKD_KEY_DIR; default "
                                          "./lockd-keys)")
    actions.add_parser("list", parents=[common], help="every key: signing, pending, published, "
                                                      "retired")
    rot = actions.add_parser("rotate", parents=[common],
                             help="add a key: published now, signing after the delay")
    rot.add_argument("--publish-delay-ms", type=int, default=DEFAULT_PUBLISH_DELAY_MS,
                     help="published this long before it signs; more than every replica's "
                          "LOCKD_KEY_RELOAD_MS plus the proxies' PROXY_JWKS_REFETCH_INTERVAL_MS "
                          f"(default {DEFAULT_PUBLISH_DELAY_MS})")
    ret = actions.add_parser("retire", parents=[common],
                             help="stop publishing a key that no longer signs")
    ret.add_argument("kid", metavar="KID", nargs="?",
                     help="the key's id, as `lockd keys list` prints it")
    ret.add_argument("--kid", dest="kid_option", metavar="KID",
                     help="the same; a KID that begins with '-' is taken either way")
    ret.add_argument("--max-ttl-ms", type=int,
                     help="the servers' longest lease (env LOCKD_MAX_TTL_MS; default 3600000): "
                          "retirement waits this long after the key stopped signing")
    ret.add_argument("--force", action="store_true",
                     help="retire now, even if live leases may hold tokens of the key")


def protect_kids(argv: Sequence[str]) -> list[str]:
    """``argv`` with each thumbprint-shaped argument of ``keys retire`` that begins with ``-``
    rewritten to ``--kid=KID`` (no option of ``lockd`` has that shape, so nothing else changes)."""
    argv = list(argv)
    if argv[:2] != ["keys", "retire"]:
        return argv
    return argv[:2] + [f"--kid={arg}" if _KID.fullmatch(arg) else arg for arg in argv[2:]]


def run(args: argparse.Namespace) -> int:
    """Run the parsed ``lockd keys ...`` command; returns the exit status."""
    key_dir = Path(args.key_dir or os.environ.get("LOCKD_KEY_DIR") or "./lockd-keys")
    try:
        if args.keys_command == "list":
            return _list(key_dir)
        if args.keys_command == "rotate":
            if args.publish_delay_ms < 0:
                print("lockd keys rotate: --publish-delay-ms must be >= 0", file=sys.stderr)
                return 2
            state = rotate(key_dir, publish_delay_s=args.publish_delay_ms / 1000)
            print(f"new key {state.kid}: published now, signs from {_when(state.signs_from)}")
            _audit("key_rotate", state.kid, "ok", key_dir=str(key_dir))
            return 0
        kid = args.kid_option or args.kid
        if not kid or (args.kid_option and args.kid):
            print("lockd keys retire: give one KID", file=sys.stderr)
            return 2
        args.kid = kid
        max_ttl = args.max_ttl_ms if args.max_ttl_ms is not None else _env_max_ttl()
        if max_ttl is None or max_ttl < 1:
            print("lockd keys retire: --max-ttl-ms / LOCKD_MAX_TTL_MS must be a positive "
                  "integer", file=sys.stderr)
            return 2
        print(retire(key_dir, args.kid, max_ttl_ms=max_ttl, force=args.force))
        _audit("key_retire", args.kid, "ok", key_dir=str(key_dir), force=args.force)
        return 0
    except KeyDirError as exc:
        print(f"lockd keys {args.keys_command}: {exc}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"lockd keys {args.keys_command}: {exc}", file=sys.stderr)
        return 1


def _env_max_ttl() -> int | None:
    raw = os.environ.get("LOCKD_MAX_TTL_MS")
    if raw is None:
        return _DEFAULT_MAX_TTL_MS
    try:
        return int(raw)
    except ValueError:
        return None


def _list(key_dir: Path) -> int:
    if not key_dir.is_dir():
        print(f"lockd keys list: no key directory {key_dir}", file=sys.stderr)
        return 1
    print(f"{'KID':<44} {'STATE':<10} {'SIGNS FROM':<21} {'STOPPED':<21} RETIRED")
    for key in list_keys(key_dir):
        print(f"{key.kid:<44} {key.state:<10} {_when(key.signs_from):<21} "
              f"{_when(key.stopped_at):<21} {_when(key.retired_at)}")
    return 0


def _when(at: float | None) -> str:
    if at is None or at == float("-inf"):
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def _audit(action: str, target: str, result: str, **detail: Any) -> None:
    """The audit line of a key operation (``audit {json}`` on stderr, as lockd logs its own),
    by the operating-system user who ran it; running lockds add a ``keys_changed`` entry to
    their trail when they pick the change up."""
    audit_log = logging.getLogger("lockd.audit")
    if not audit_log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        audit_log.addHandler(handler)
        audit_log.setLevel(logging.INFO)
    AuditTrail().record(_operator(), action, target, result, **detail)


def _operator() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid-{os.getuid()}"
