"""The ``lockctl`` subcommands of semaphores and elections (the rest: ``lockd.client.lockctl``).

::

    lockctl [--json] sem acquire NAME --limit N --ttl 30s [--wait 10s] [--owner O]
    lockctl [--json] sem release NAME [LEASE_ID | -]
    lockctl [--json] sem status NAME
    lockctl sem run NAME --limit N --ttl 30s [--wait 10s] [--grace 5s] -- COMMAND [ARG...]
    lockctl elect NAME --value V [--ttl 10s] [--wait 1m] [--grace 5s] -- COMMAND [ARG...]
    lockctl [--json] leader NAME
    lockctl [--json] observe NAME [--after SEQ]
    lockctl [--json] object put|get|ls BUCKET ...     (``lockd.client.lockctl_objects``)

``sem acquire`` takes one permit of semaphore NAME (at most ``--limit`` live permits) and prints
it (slot, fence, token, lease id); like ``acquire`` it is NOT renewed. ``sem release`` frees a
permit by lease id (from the argument, ``-`` for stdin, or ``$LOCKD_LEASE_ID``). ``sem status``
shows the limit, the permits held (owner, slot, fence, time left) and how many wait. ``sem run``
holds a permit while COMMAND runs, as ``run`` holds a lock: COMMAND gets ``LOCKD_SEMAPHORE``,
``LOCKD_SLOT``, ``LOCKD_LOCK`` (``sem/NAME/SLOT``, the lock the token names), ``LOCKD_FENCE`` and
``LOCKD_TOKEN``, and SIGTERM (SIGKILL after ``--grace``) if the permit is lost. A ``--limit``
other than the one the semaphore's live permits were granted under exits 2, naming the limit.

``elect`` campaigns in election NAME with ``--value`` (waiting for the lead as long as
``--wait``, default forever; 75 if not elected within it), then runs COMMAND only while leading:
it gets ``LOCKD_ELECTION``, ``LOCKD_LOCK`` (NAME), ``LOCKD_FENCE``, ``LOCKD_TOKEN`` and
``LOCKD_VALUE``; the lead is renewed every ttl/3 and given up (resigned) when COMMAND exits. If
the lead is lost, COMMAND gets SIGTERM (SIGKILL after ``--grace``) and lockctl exits 79, as
``run``. If lockd asks the leader to hand over (``POST /v1/elections/NAME/handover``), COMMAND is
stopped the same way, the leader resigns so the preferred candidate leads next, and COMMAND's
own status is passed through.

``leader`` prints who leads NAME (owner, value, fence, time left, candidates waiting) and exits 0
either way. ``observe`` prints every change of NAME as it happens (``--json``: one object a
line), starting with its current state, resuming after the last change seen when the stream
breaks, until interrupted (exit 0).
"""

from __future__ import annotations

import argparse
import os
import threading
from collections.abc import Callable
from typing import Any

from lockd.client import lockctl_objects as objects
from lockd.client.durations import format_duration
from lockd.client.leadership import ElectionEvent, ElectionStatus
from lockd.client.lease import LeaseRef
from lockd.client.lockctl_common import (
    EXIT_OK,
    Out,
    default_owner,
    duration,
    run_under,
)
from lockd.client.permits import PermitLease, SemaphoreStatus

__all__ = ["add_commands", "command_usage", "takes_lease_id", "dispatch"]

_NAME = "the semaphore's name, e.g. jobs/encoders"
_TTL = "lease time to live, with a unit: 500ms, 30s, 2m"
_WAIT = "how long to wait while every permit is taken (default 0: try once)"
_OWNER = "a label shown to others in status (default: lockctl USER@HOST pid N)"
_GRACE = "time between SIGTERM and SIGKILL when the lease is lost (default 5s)"


def add_commands(add: Callable[[str, str], argparse.ArgumentParser],
                 common: argparse.ArgumentParser) -> None:
    """Add ``sem``, ``elect``, ``leader`` and ``observe`` with ``add(name, help)`` (lockctl's);
    ``common`` is the parent parser of the options every subcommand takes."""
    sem = add("sem", "counting semaphores: sem acquire|release|status|run NAME --limit N")
    sub = sem.add_subparsers(dest="sem_cmd", required=True, metavar="SEM_COMMAND")

    def sem_add(name: str, help_: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], help=help_, description=help_)

    p = sem_add("acquire", "take one permit once and print it; it is NOT renewed (see sem run)")
    _permit_args(p)
    p = sem_add("release", "free a permit by semaphore name and lease id")
    p.add_argument("name", help=_NAME)
    p.add_argument("lease_id", nargs="?", default=None,
                   help="the lease id; '-': read it from stdin; left out: $LOCKD_LEASE_ID")
    p = sem_add("status", "show a semaphore: limit, permits held (owner, slot, fence), waiters")
    p.add_argument("name", help=_NAME)
    p = sem_add("run", "hold a permit while a command runs: sem run NAME --limit N --ttl 30s "
                       "-- COMMAND (env LOCKD_SLOT, LOCKD_LOCK, LOCKD_FENCE, LOCKD_TOKEN)")
    _permit_args(p)
    p.add_argument("--grace", type=duration, default=5.0, help=_GRACE)
    p.add_argument("--renew-every", type=duration, default=None,
                   help="renewal period (default ttl/3)")

    p = add("elect", "lead an election while a command runs: elect NAME --value V -- COMMAND "
                     "(stopped when the lead is lost or handed over)")
    p.add_argument("name", help="the election's name (a lock name), e.g. jobs/scheduler")
    p.add_argument("--value", default="", help="the leader's value others see, e.g. host:port")
    p.add_argument("--ttl", type=duration, default=10.0, help=_TTL + " (default 10s)")
    p.add_argument("--wait", type=duration, default=None,
                   help="how long to campaign before giving up (default: until elected)")
    p.add_argument("--owner", default=None, help=_OWNER)
    p.add_argument("--grace", type=duration, default=5.0, help=_GRACE)
    p.add_argument("--renew-every", type=duration, default=None,
                   help="renewal period (default ttl/3)")

    p = add("leader", "show who leads an election: owner, value, fence, time left, waiting")
    p.add_argument("name", help="the election's name")
    objects.add_commands(add, common)
    p = add("observe", "print an election's changes as they happen (leader, proclaim, resign)")
    p.add_argument("name", help="the election's name")
    p.add_argument("--after", type=int, default=None, metavar="SEQ",
                   help="start after this change's seq (without the current state)")


def _permit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help=_NAME)
    p.add_argument("--limit", type=int, required=True,
                   help="the number of permits, 1-10000 (the same for every holder)")
    p.add_argument("--ttl", type=duration, required=True, help=_TTL)
    p.add_argument("--wait", type=duration, default=0.0, help=_WAIT)
    p.add_argument("--owner", default=None, help=_OWNER)


def command_usage(args: argparse.Namespace) -> str | None:
    """The usage line of a subcommand here that runs a COMMAND after ``--`` (else ``None``)."""
    if args.cmd == "elect":
        return "elect NAME --value V -- COMMAND [ARG...]"
    if args.cmd == "sem" and args.sem_cmd == "run":
        return "sem run NAME --limit N --ttl 30s -- COMMAND [ARG...]"
    return None


def takes_lease_id(args: argparse.Namespace) -> bool:
    return args.cmd == "sem" and args.sem_cmd == "release"


def dispatch(client: Any, args: argparse.Namespace, command: list[str], out: Out) -> int:
    """Run a subcommand of this module; returns the exit status."""
    if args.cmd == "sem":
        return _sem(client, args, command, out)
    if args.cmd == "elect":
        return _elect(client, args, command, out)
    if args.cmd == "leader":
        status = client.leader(args.name)
        out.emit(status.to_json(), _leader_text(status))
        return EXIT_OK
    if args.cmd == "observe":
        return _observe(client, args, out)
    if args.cmd == "object":
        return objects.dispatch(client, args, out)
    raise AssertionError(f"unknown command {args.cmd!r}")


# --------------------------------------------------------------------------- semaphores


def _sem(client: Any, args: argparse.Namespace, command: list[str], out: Out) -> int:
    owner = getattr(args, "owner", None) or default_owner()
    if args.sem_cmd == "acquire":
        permit = client.acquire_permit(args.name, args.limit, args.ttl, wait=args.wait,
                                       owner=owner, auto_renew=False)
        note = (f"  note      not renewed: it expires in "
                f"{format_duration(round(permit.ttl * 1000))} (`lockctl sem run` holds a permit "
                "while a command runs)")
        out.emit(permit.as_dict(), _permit_text(permit) + "\n" + note)
    elif args.sem_cmd == "release":
        client.release(LeaseRef(args.name, args.lease_id, kind="semaphore"))
        out.emit({"semaphore": args.name, "released": True}, f"released a permit of {args.name}")
    elif args.sem_cmd == "status":
        status = client.semaphore_status(args.name)
        out.emit(status.to_json(), _sem_status_text(status))
    else:
        permit = client.acquire_permit(args.name, args.limit, args.ttl, wait=args.wait,
                                       owner=owner, renew_every=args.renew_every)
        env = {**os.environ, "LOCKD_SEMAPHORE": permit.semaphore, "LOCKD_SLOT": str(permit.slot),
               "LOCKD_LOCK": permit.lock, "LOCKD_FENCE": str(permit.fence),
               "LOCKD_TOKEN": permit.token}
        return run_under(client, permit, command, env, out, args.grace)
    return EXIT_OK


def _permit_text(permit: PermitLease) -> str:
    return "\n".join([
        f"acquired a permit of {permit.semaphore} (slot {permit.slot} of {permit.limit})",
        f"  lock      {permit.lock}",
        f"  fence     {permit.fence}",
        f"  ttl       {format_duration(round(permit.ttl * 1000))}",
        f"  owner     {permit.owner}",
        f"  lease_id  {permit.lease_id}",
        f"  token     {permit.token}",
    ])


def _sem_status_text(s: SemaphoreStatus) -> str:
    if s.limit == 0:
        return f"{s.semaphore}: never used (no permit held, {s.waiters} waiting)"
    lines = [f"{s.semaphore}: {len(s.permits)} of {s.limit} permits held (last fence {s.fence}, "
             f"{s.waiters} waiting)"]
    lines += [f"  slot {p.slot}  fence {p.fence}  {format_duration(round(p.ttl * 1000))} left"
              f"  owner {p.owner!r}" for p in s.permits]
    return "\n".join(lines)


# --------------------------------------------------------------------------- elections


def _elect(client: Any, args: argparse.Namespace, command: list[str], out: Out) -> int:
    step_down = threading.Event()
    finished = threading.Event()

    def on_handover(_lease: Any, _target: str) -> None:
        # The command is stopped and the lead released by ``run_under``; hold the library's
        # own resign back until then (it would only find the lease released).
        step_down.set()
        finished.wait(args.grace + 5)

    lease = client.campaign(args.name, args.value, args.ttl, wait=args.wait,
                            owner=args.owner or default_owner(), renew_every=args.renew_every,
                            on_handover=on_handover, handover_grace=args.grace + 5)
    env = {**os.environ, "LOCKD_ELECTION": lease.election, "LOCKD_LOCK": lease.lock,
           "LOCKD_FENCE": str(lease.fence), "LOCKD_TOKEN": lease.token,
           "LOCKD_VALUE": lease.value}
    try:
        return run_under(client, lease, command, env, out, args.grace, step_down=step_down)
    finally:
        finished.set()


def _leader_text(s: ElectionStatus) -> str:
    waiting = f"{s.waiters} waiting"
    if s.leader is None:
        return f"{s.election}: no leader (last fence {s.fence}, {waiting})"
    left = format_duration(round(s.ttl * 1000))
    handover = f", handing over to {s.handover_to!r}" if s.handover_to else ""
    return (f"{s.election}: led by {s.leader!r} (fence {s.fence}, value {s.value!r}, {left} "
            f"left, {waiting}{handover})")


def _event_text(e: ElectionEvent) -> str:
    if e.kind == "state":
        who = "no leader" if e.owner is None else f"led by {e.owner!r}"
        return f"#{e.seq:<5} state     {who}  fence {e.fence}  value {e.value!r}"
    if e.kind == "resign":
        return f"#{e.seq:<5} resign    {e.owner!r}  fence {e.fence}"
    return f"#{e.seq:<5} {e.kind:<9} {e.owner!r}  fence {e.fence}  value {e.value!r}"


def _observe(client: Any, args: argparse.Namespace, out: Out) -> int:
    try:
        for event in client.observe(args.name, last_event_id=args.after):
            out.emit(event.to_json(), _event_text(event))
    except KeyboardInterrupt:
        pass
    return EXIT_OK
