"""``lockctl``: lockd from the shell.

::

    lockctl [--url URL] [--json] acquire NAME --ttl 30s [--wait 10s] [--owner O] [--shared]
    lockctl [--url URL] [--json] renew NAME [LEASE_ID | -] [--ttl 30s]
    lockctl [--url URL] [--json] release NAME [LEASE_ID | -]
    lockctl [--url URL] [--json] status NAME
    lockctl [--url URL] [--json] holders NAME
    lockctl [--url URL] [--json] ls [--prefix P] [--limit N]
    lockctl [--url URL] [--json] watch [NAME | --prefix P] [--history N]
    lockctl [--url URL] run NAME --ttl 30s [--wait 10s] [--grace 5s] [--shared] -- COMMAND [ARG...]
    lockctl [--url URL] run --lock A --lock B --ttl 30s [--wait 10s] -- COMMAND [ARG...]
    lockctl [--url URL] [--json] force-release NAME        (needs an admin key)
    lockctl [--url URL] [--json] sem acquire|release|status|run NAME --limit N ...
    lockctl [--url URL] elect NAME --value V [--ttl 10s] -- COMMAND [ARG...]
    lockctl [--url URL] [--json] leader NAME
    lockctl [--url URL] [--json] observe NAME
    lockctl [--url URL] [--json] conformance TARGET_URL --lock NAME --write 'METHOD PATH [JSON]'
    lockctl --version

``sem``, ``elect``, ``leader`` and ``observe`` are described in ``lockd.client.lockctl_more``,
``conformance`` in ``lockd.client.lockctl_conformance``.
``--shared`` asks for a shared (read) lease: it coexists with other shared holders, never with
an exclusive one, and its token may read but not write what the lock governs; ``run --shared``
holds every lock it names shared and sets ``LOCKD_MODE=shared`` for COMMAND (``exclusive``
otherwise).

``--url`` defaults to ``$LOCKD_URL``, else ``http://127.0.0.1:7070``; ``--api-key`` to
``$LOCKD_API_KEY`` (sent as ``Authorization: Bearer``; prefer the variable: arguments show in
``ps``). For an ``https://`` URL, ``--ca`` (``$LOCKD_CA``) is the CA file that signed lockd's
certificate (default: the system's CAs) and ``--cert``/``--key`` (``$LOCKD_CERT``,
``$LOCKD_KEY``) the client certificate lockd asks for under mTLS (exit 2 if they cannot be
read; a handshake lockd refuses is "unavailable", 69). Durations take a unit:
``500ms``, ``30s``, ``2m``, ``1h``, ``1m30s``. ``--wait`` defaults to 0 (try once). Output is
for humans unless ``--json`` (one JSON document on stdout; leases in the contract's shape, with
``ttl_ms``). ``--url`` and ``--json`` may also follow the subcommand.

A lease id is a secret (whoever has it can renew or release the lease), and arguments show in
``ps`` and shell history: ``renew`` and ``release`` take it from ``$LOCKD_LEASE_ID`` when
LEASE_ID is left out, or from the first line of standard input when LEASE_ID is ``-``
(``lockctl --json acquire ... | jq -r .lease_id | lockctl release NAME -``). A LEASE_ID on the
command line still works, for scripts that already pass one.

``acquire`` does not renew: the lease ends after ``--ttl`` unless ``renew`` extends it (its
output says so); ``run`` is the command that holds a lock while something runs.
``force-release`` ends the live lease of NAME whoever holds it (its holder's renew and release
then fail as lost, the next acquire gets a higher fence); lockd allows it only with one of its
admin keys (``LOCKD_ADMIN_KEYS``) as ``--api-key``/``$LOCKD_API_KEY``. ``holders`` lists the
holder and the owners of the acquires waiting for the lock, head first, as the lockd at ``--url``
sees them: waiters are per lockd process (another replica's are not shown).

Errors say what to do: lockd unreachable names the URL tried and ``--url``/``$LOCKD_URL``; a URL
without ``http://``/``https://`` is a usage error (2); a 401 says to pass ``--api-key`` or
``$LOCKD_API_KEY``.

``watch`` prints lock events (acquired, released, expired, with fences) as the lockd at
``--url`` sees them, one line each (``--json``: one JSON object a line), until interrupted
(exit 0) or lockd closes the stream (exit 69).

``run`` acquires the lock, starts COMMAND in its own process group with ``LOCKD_LOCK``,
``LOCKD_FENCE`` and ``LOCKD_TOKEN`` (the fencing token to hand to the proxy) in its environment,
renews the lease in the background every ttl/3 (``--renew-every``) and releases it when COMMAND
exits. If the lease is lost (lockd answers 410, or no renewal succeeded before the local
deadline), COMMAND's process group gets SIGTERM, then SIGKILL after ``--grace`` (default 5s).
SIGINT, SIGTERM and SIGHUP sent to lockctl are forwarded to COMMAND's process group.

``run --lock A --lock B`` (or ``run A --lock B``) holds several locks as one multi-lock lease:
all are acquired in one atomic grant (waiting holds none of them), renewed and released
together. COMMAND then gets ``LOCKD_LOCKS`` (the names, comma-separated, in name order),
``LOCKD_FENCES`` (JSON ``{"name": fence, ...}``) and ``LOCKD_TOKEN`` (the one multi-lock token
carrying every fence); ``LOCKD_LOCK`` and ``LOCKD_FENCE`` are not set. A single-lock ``run`` sets
``LOCKD_LOCKS`` and ``LOCKD_FENCES`` too, for the one lock.

Exit codes:

====  ==============================================================================
0     success (``run``, ``sem run``, ``elect``: COMMAND's own status is passed through)
1     any other error (unexpected answer from lockd, ...)
2     usage error: bad arguments, bad duration, lockd rejected the request (422), a
      semaphore's --limit differs from the one its permits were granted under
69    lockd unavailable (EX_UNAVAILABLE): no answer, or 503 store_unavailable
75    lock not acquired (EX_TEMPFAIL): held by someone else within ``--wait``
79    lease lost: renew/release of a lease that is not live, or ``run`` lost the lease
      before it released it (COMMAND was stopped, or had just finished)
126   ``run``: COMMAND is not executable;  127: COMMAND not found
128+N ``run``: COMMAND was killed by signal N (shell convention)
141   the reader of lockctl's output went away (``lockctl ls | head``); nothing is printed
====  ==============================================================================
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import time
from collections.abc import Sequence
from typing import Any

from lockd.client import LockClient
from lockd.client import lockctl_conformance as conformance
from lockd.client import lockctl_more as more
from lockd.client.durations import format_duration
from lockd.client.errors import (
    LockClientError,
    LockNotAcquired,
    PermissionDenied,
    TransportError,
)
from lockd.client.lease import Lease, LeaseRef, LockStatus
from lockd.client.lockctl_common import (
    EXIT_CANNOT_EXECUTE,
    EXIT_ERROR,
    EXIT_LEASE_LOST,
    EXIT_NOT_ACQUIRED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_PIPE_CLOSED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    Out,
    default_owner,
    duration,
    exit_code,
    lease_id_of,
    run_under,
)
from lockd.client.wire import DEFAULT_URL, lock_path

__all__ = [
    "EXIT_OK",
    "EXIT_ERROR",
    "EXIT_USAGE",
    "EXIT_UNAVAILABLE",
    "EXIT_NOT_ACQUIRED",
    "EXIT_LEASE_LOST",
    "EXIT_CANNOT_EXECUTE",
    "EXIT_NOT_FOUND",
    "main",
]

_duration = duration
_default_owner = default_owner
_Out = Out
_exit_code = exit_code
_lease_id = lease_id_of


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=argparse.SUPPRESS,
                        help=f"lockd base URL, http:// or https:// (default: $LOCKD_URL or "
                             f"{DEFAULT_URL})")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print JSON for scripts")
    common.add_argument("--api-key", default=argparse.SUPPRESS,
                        help="lockd API key (default: $LOCKD_API_KEY)")
    # TLS (an https:// --url): the CA to trust, and a client certificate for mTLS
    common.add_argument("--ca", default=argparse.SUPPRESS,
                        help="CA file that signed lockd's certificate (default: $LOCKD_CA, "
                             "else the system's CAs)")
    common.add_argument("--cert", default=argparse.SUPPRESS,
                        help="client certificate, PEM (default: $LOCKD_CERT)")
    common.add_argument("--key", default=argparse.SUPPRESS,
                        help="its private key, PEM (default: $LOCKD_KEY; omit if --cert "
                             "holds both)")
    parser = argparse.ArgumentParser(prog="lockctl", parents=[common],
                                     description="Command line client of lockd.",
                                     epilog="Exit codes: 0 ok, 1 error, 2 usage, 69 lockd "
                                            "unavailable, 75 not acquired, 79 lease lost; run, "
                                            "sem run and elect pass COMMAND's status through.")
    parser.add_argument("--version", action="version", version=f"lockctl {_version()}")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], help=help_, description=help_)

    name_help = "the lock's name, e.g. jobs/nightly"
    ttl_help = "lease time to live, with a unit: 500ms, 30s, 2m"
    wait_help = "how long to wait while someone else holds the lock (default 0: try once)"
    owner_help = "a label shown to others in status and ls (default: lockctl USER@HOST pid N)"
    shared_help = ("a shared (read) lease: coexists with other shared holders, never with an "
                   "exclusive one; its token may read, not write")
    p = add("acquire", "acquire a lock once and print the lease; it is NOT renewed (see run)")
    p.add_argument("name", help=name_help)
    p.add_argument("--ttl", type=_duration, required=True, help=ttl_help)
    p.add_argument("--wait", type=_duration, default=0.0, help=wait_help)
    p.add_argument("--owner", default=None, help=owner_help)
    p.add_argument("--shared", action="store_true", help=shared_help)

    lease_help = "the lease id; '-': read it from stdin; left out: $LOCKD_LEASE_ID (the " \
                 "safe ways: arguments show in ps and shell history)"
    p = add("renew", "renew a lease by lock name and lease id")
    p.add_argument("name", help=name_help)
    p.add_argument("lease_id", nargs="?", default=None, help=lease_help)
    p.add_argument("--ttl", type=_duration, default=None,
                   help="new time to live from now (default: the lease's current TTL)")

    p = add("release", "release a lease by lock name and lease id")
    p.add_argument("name", help=name_help)
    p.add_argument("lease_id", nargs="?", default=None, help=lease_help)

    p = add("status", "show one lock: holder, fence, time left, how many wait")
    p.add_argument("name", help=name_help)

    p = add("holders", "show who holds one lock and who waits for it, head first (waiters "
                       "queued at this lockd only)")
    p.add_argument("name", help=name_help)

    p = add("ls", "list locks (every lock ever used: lockd never deletes them)")
    p.add_argument("--prefix", default="", help="only locks whose name starts with this")
    p.add_argument("--limit", type=int, default=None, help="show at most this many locks")

    p = add("watch", "print lock events as they happen (of NAME, or of locks named --prefix…)")
    p.add_argument("name", nargs="?", default=None, help="the one lock to watch (default: all)")
    p.add_argument("--prefix", default="", help="watch the locks whose name starts with this")
    p.add_argument("--history", type=int, default=0, help="recent events to show first (0-256)")

    p = add("run", "hold a lock while a command runs: run NAME --ttl 30s -- COMMAND [ARG...]; "
                   "several: run --lock A --lock B --ttl 30s -- COMMAND (env LOCKD_LOCKS, "
                   "LOCKD_FENCES, LOCKD_TOKEN)")
    p.add_argument("name", nargs="?", default=None, help=name_help)
    p.add_argument("--lock", dest="locks", action="append", default=[], metavar="NAME",
                   help="a lock to hold (repeat for several, granted all at once as one "
                        "multi-lock lease)")
    p.add_argument("--ttl", type=_duration, required=True, help=ttl_help)
    p.add_argument("--wait", type=_duration, default=0.0, help=wait_help)
    p.add_argument("--owner", default=None, help=owner_help)
    p.add_argument("--grace", type=_duration, default=5.0,
                   help="time between SIGTERM and SIGKILL when the lease is lost (default 5s)")
    p.add_argument("--renew-every", type=_duration, default=None,
                   help="renewal period (default ttl/3)")
    p.add_argument("--shared", action="store_true", help=shared_help + " (every lock named)")

    p = add("force-release", "end the live lease of a lock whoever holds it (needs an admin "
                             "key: --api-key or LOCKD_API_KEY)")
    p.add_argument("name", help=name_help)
    more.add_commands(add, common)
    conformance.add_command(add)
    return parser


def _version() -> str:
    from lockd import __version__  # the package, not this module, owns the version

    return __version__


def _lease_text(verb: str, lease: Lease) -> str:
    return "\n".join([
        f"{verb} {lease.lock}",
        f"  fence     {lease.fence}",
        f"  ttl       {format_duration(round(lease.ttl * 1000))}",
        f"  owner     {lease.owner}",
        f"  lease_id  {lease.lease_id}",
        f"  token     {lease.token}",
    ])


def _status_text(s: LockStatus) -> str:
    if not s.held:
        return f"{s.lock}: free (last fence {s.fence}, {s.waiters} waiting)"
    left = format_duration(round(s.ttl * 1000))
    return (f"{s.lock}: held {_held_by(s)} (fence {s.fence}, {left} left, {s.waiters} "
            "waiting)")


def _held_by(s: LockStatus) -> str:
    """``by 'owner'``, or for shared holders ``shared by 2: 'a', 'b'``."""
    if s.mode == "shared" and s.holders:
        owners = ", ".join(repr(h.owner) for h in s.holders)
        return f"shared by {len(s.holders)}: {owners}"
    return f"by {s.owner!r}"


def _holders_text(s: LockStatus) -> str:
    owners = s.waiting_owners or ()
    holder = f"held {_held_by(s)} (fence {s.fence})" if s.held else "free"
    if not owners:
        return f"{s.lock}: {holder}; nobody waiting at this lockd"
    lines = [f"{s.lock}: {holder}; {len(owners)} waiting at this lockd, head first:"]
    lines += [f"  {i}. {owner!r}" if owner else f"  {i}. (no owner)"
              for i, owner in enumerate(owners, 1)]
    return "\n".join(lines)


def _ls_text(items: list[LockStatus]) -> str:
    rows = [("LOCK", "HELD", "FENCE", "TTL", "WAITERS", "OWNER")]
    for s in items:
        rows.append((s.lock, "yes" if s.held else "no", str(s.fence),
                     format_duration(round(s.ttl * 1000)) if s.held else "-", str(s.waiters),
                     s.owner or ""))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:5], widths, strict=True)) + "  " + r[5]
                     for r in rows).rstrip()


def _run(client: LockClient, args: argparse.Namespace, command: list[str], out: Out) -> int:
    names = ([args.name] if args.name else []) + list(args.locks)
    owner = args.owner or _default_owner()
    lease: Lease
    if len(names) == 1:
        lease = client.acquire(names[0], args.ttl, wait=args.wait, owner=owner,
                               renew_every=args.renew_every, shared=args.shared)
        env = {**os.environ, "LOCKD_LOCK": lease.lock, "LOCKD_FENCE": str(lease.fence),
               "LOCKD_TOKEN": lease.token, "LOCKD_LOCKS": lease.lock,
               "LOCKD_FENCES": json.dumps({lease.lock: lease.fence}),
               "LOCKD_MODE": lease.mode}
    else:
        multi = client.acquire_many(names, args.ttl, wait=args.wait, owner=owner,
                                    renew_every=args.renew_every,
                                    shared=names if args.shared else ())
        lease = multi
        env = {k: v for k, v in os.environ.items() if k not in ("LOCKD_LOCK", "LOCKD_FENCE")}
        env.update({"LOCKD_LOCKS": ",".join(multi.locks),
                    "LOCKD_FENCES": json.dumps(multi.fences), "LOCKD_TOKEN": multi.token,
                    "LOCKD_MODE": "shared" if args.shared else "exclusive"})
    return run_under(client, lease, command, env, out, args.grace)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lockctl`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, command = argv[:at], argv[at + 1:]
    parser = _parser()
    args = parser.parse_args(argv)  # exits 2 on a usage error
    out = _Out(getattr(args, "json", False))
    usage = more.command_usage(args)
    if args.cmd == "run":
        usage = "run NAME --ttl 30s -- COMMAND [ARG...]"
    if usage and not command:
        parser.error(f"{usage.split()[0]} needs a command after --: {usage}")
    if args.cmd == "run" and not (args.name or args.locks):
        parser.error("run needs a lock: run NAME ... or run --lock A --lock B ...")
    if not usage and command:
        parser.error(f"{args.cmd} takes no command after --")
    if args.cmd in ("renew", "release") or more.takes_lease_id(args):
        args.lease_id = _lease_id(args.lease_id)
    url = getattr(args, "url", None) or os.environ.get("LOCKD_URL") or DEFAULT_URL
    if not url.lower().startswith(("http://", "https://")):
        where = "--url" if getattr(args, "url", None) else "LOCKD_URL"
        print(f"lockctl: the lockd URL {url!r} ({where}) needs a scheme: http://{url} or "
              "https://...", file=sys.stderr)
        return EXIT_USAGE
    api_key = getattr(args, "api_key", None) or os.environ.get("LOCKD_API_KEY") or None
    ca = getattr(args, "ca", None) or os.environ.get("LOCKD_CA") or None
    cert = getattr(args, "cert", None) or os.environ.get("LOCKD_CERT") or None
    key = getattr(args, "key", None) or os.environ.get("LOCKD_KEY") or None
    if key and not cert:
        parser.error("--key (LOCKD_KEY) needs --cert (LOCKD_CERT)")
    try:
        client = LockClient(url, api_key=api_key, verify=ca or True,
                            cert=(cert, key) if key else cert)
    except (OSError, ssl.SSLError) as exc:
        print(f"lockctl: cannot use the TLS files: {exc}", file=sys.stderr)
        return 2
    try:
        with client:
            code = _dispatch(client, args, command, out)
            sys.stdout.flush()  # here, so that a closed pipe is met below, not at exit
            return code
    except LockClientError as exc:
        out.error(_explained(exc, url, args))
        return _exit_code(exc)
    except BrokenPipeError:
        return _pipe_closed()


def _pipe_closed() -> int:
    """``lockctl ... | head``: the reader left. Quiet, as a C tool killed by SIGPIPE would be:
    stdout goes to /dev/null (so the exit-time flush cannot fail again), exit 141 (128+13)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_PIPE_CLOSED


_TLS_FLAGS = {  # TransportError.tls -> what to do, in lockctl's flags
    "unknown_ca": "lockd at {url} has a certificate signed by a CA lockctl does not trust: pass "
                  "that CA's file with --ca (or LOCKD_CA)",
    "client_cert": "lockd at {url} asks for a client certificate (mTLS) and none was given: "
                   "pass --cert and --key (or LOCKD_CERT and LOCKD_KEY)",
    "client_cert_refused": "lockd at {url} refused the client certificate of --cert/--key: is it "
                           "signed by the CA lockd trusts for clients (its --tls-client-ca), "
                           "and still valid?",
    "plain_http": "lockd at {url} speaks https, not http: use --url {https}",
    "not_tls": "lockd at {url} does not speak TLS: use --url {http}",
}


def _explained(exc: LockClientError, url: str, args: argparse.Namespace) -> LockClientError:
    """``exc`` with a detail that says what to do, for the errors a newcomer meets first."""
    if isinstance(exc, LockNotAcquired) and (args.cmd in ("acquire", "run", "elect")
                                             or getattr(args, "sem_cmd", None) in ("acquire",
                                                                                   "run")):
        exc.detail += ("; a longer --wait may get it" if getattr(args, "wait", 0) > 0 else
                       "; to wait for it, pass --wait (e.g. --wait 30s)")
    elif isinstance(exc, TransportError) and exc.tls in _TLS_FLAGS:
        exc.detail = _TLS_FLAGS[exc.tls].format(url=url, https=url.replace("http://", "https://", 1),
                                                http=url.replace("https://", "http://", 1))
    elif isinstance(exc, TransportError):
        cause = exc.reason or exc.detail
        exc.detail = (f"cannot reach lockd at {url} ({cause}); is it running? Point lockctl "
                      "elsewhere with --url or LOCKD_URL")
    elif isinstance(exc, PermissionDenied) and exc.status == 401:
        said = exc.problem.get("detail") or exc.detail
        exc.detail = (f"lockd wants an API key (401: {said}): pass it with --api-key or "
                      "set LOCKD_API_KEY")
    return exc


def _dispatch(client: LockClient, args: argparse.Namespace, command: list[str], out: _Out) -> int:
    if args.cmd == "acquire":
        lease = client.acquire(args.name, args.ttl, wait=args.wait,
                               owner=args.owner or _default_owner(), auto_renew=False,
                               shared=args.shared)
        note = (f"  note      not renewed: it expires in "
                f"{format_duration(round(lease.ttl * 1000))} unless `lockctl renew` extends it "
                "(`lockctl run` holds a lock while a command runs)")
        out.emit(lease.as_dict(), _lease_text("acquired", lease) + "\n" + note)
    elif args.cmd == "renew":
        lease = client.renew(LeaseRef(args.name, args.lease_id), ttl=args.ttl)
        out.emit(lease.as_dict(), _lease_text("renewed", lease))
    elif args.cmd == "release":
        client.release(LeaseRef(args.name, args.lease_id))
        out.emit({"lock": args.name, "released": True}, f"released {args.name}")
    elif args.cmd == "status":
        s = client.status(args.name)
        out.emit(s.to_json(), _status_text(s))
    elif args.cmd == "holders":
        s = client.status(args.name)
        doc = {"lock": s.lock, "held": s.held, "fence": s.fence, "owner": s.owner,
               "waiting_owners": list(s.waiting_owners or ())}
        if s.mode == "shared":  # every reader (an exclusive holder is ``owner``)
            doc.update(mode=s.mode, holders=s.to_json().get("holders", []))
        out.emit(doc, _holders_text(s))
    elif args.cmd == "ls":
        items = list(client.locks(args.prefix, limit=args.limit))
        out.emit({"items": [s.to_json() for s in items]}, _ls_text(items))
    elif args.cmd == "force-release":
        return _force_release(client, args, out)
    elif args.cmd == "run":
        return _run(client, args, command, out)
    elif args.cmd == "watch":
        return _watch(client, args, out)
    elif args.cmd == "conformance":
        return conformance.run(client, args, out)
    else:
        return more.dispatch(client, args, command, out)
    return EXIT_OK


def _force_release(client: LockClient, args: argparse.Namespace, out: _Out) -> int:
    try:
        body = client._request("POST", lock_path(args.name) + "/force-release")
    except PermissionDenied as exc:
        if "disabled" in exc.detail:  # lockd has no admin key at all: its line says so
            raise
        said = exc.problem.get("detail") or exc.detail
        out.error(f"force-release needs an admin key ({exc.status}: {said}): pass one of "
                  "lockd's LOCKD_ADMIN_KEYS with --api-key or LOCKD_API_KEY")
        return EXIT_ERROR
    if not isinstance(body, dict):
        body = {"lock": args.name, "released": False}
    if body.get("released"):
        human = (f"force-released {args.name} (fence {body.get('fence')}, "
                 f"owner {body.get('owner')!r})")
    else:
        human = f"{args.name} was not held"
    out.emit(body, human)
    return EXIT_OK


def _event_text(event: dict[str, Any]) -> str:
    if event.get("type") == "overflow":
        return f"overflow: {event.get('dropped', 0)} event(s) dropped; re-read with lockctl ls"
    at = event.get("at")
    when = time.strftime("%H:%M:%S", time.localtime(at / 1000)) if isinstance(at, int) else "-"
    parts = [when, f"{event.get('type', '?'):<8}", str(event.get("lock"))]
    if event.get("fence") is not None:
        parts.append(f"fence {event['fence']}")
    if event.get("owner"):
        parts.append(f"owner {event['owner']!r}")
    if event.get("ttl_ms") is not None:
        parts.append(f"ttl {format_duration(int(event['ttl_ms']))}")
    if event.get("forced"):
        parts.append("(forced)")
    return "  ".join(parts)


def _watch(client: LockClient, args: argparse.Namespace, out: _Out) -> int:
    if args.name is not None and args.prefix:
        out.error("watch takes a NAME or --prefix, not both")
        return EXIT_USAGE
    try:
        for event in client.watch(args.name, prefix=args.prefix, history=args.history):
            out.emit(event, _event_text(event))
    except KeyboardInterrupt:
        return EXIT_OK
    out.error("lockd closed the event stream")
    return EXIT_UNAVAILABLE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
