"""``resource-proxy db install|check|uninstall``: database-side fencing from the command line.

Thin over ``resource_proxy.dbfence`` (what the triggers do: docs/db-fencing.md). The options
name the database, the policy and the allow-list as ``serve`` does (flags override
``PROXY_DATABASE_URL``, ``PROXY_POLICY``, ``PROXY_TABLES``), so one configuration serves both.
The report's lines go to stdout.

Exit status: 0 done (``check``: all is protected, ``CheckReport.ok``); 1 ``check`` found a
problem (a table without its triggers, a trigger disabled or firing after the check, a claim
function open to PUBLIC, a role other than a superuser that can bypass the triggers), or the
database could not be used (one line); 2 a policy or table list the database cannot enforce, a
role that does not exist, or bad options (one line on stderr, nothing changed).

``install --claim-role ROLE`` (repeatable): the roles that may execute the claim functions
besides their owner: the proxy's role when it does not own them, and ``fenced_transaction``'s
writers. EXECUTE is never PUBLIC's; a later install converges to the roles it names.
"""

from __future__ import annotations

import argparse
import os
import sys

from sqlalchemy.exc import SQLAlchemyError

from resource_proxy.dbfence import DbFencingError, check, install, uninstall
from resource_proxy.policy import PolicyError, load_policy
from resource_proxy.store import engine_for

__all__ = ["add_parser", "run"]

_HELP = {
    "install": "install (or bring up to date) the fence triggers on the served tables",
    "check": "list protected tables without triggers, roles that can claim, and roles that "
             "can bypass the triggers",
    "uninstall": "remove every fence trigger and function (fencing.fences is kept)",
}


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Add ``db`` and its three actions to the CLI's subcommands."""
    db = commands.add_parser("db", help="fencing inside PostgreSQL (triggers)",
                             description="Fence triggers inside PostgreSQL: every write to a "
                             "protected table, whoever sends it, must claim the row's lock.")
    actions = db.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, text in _HELP.items():
        sub = actions.add_parser(action, help=text, description=text + ".")
        sub.add_argument("--database-url", help="postgresql://… (env PROXY_DATABASE_URL)")
        if action == "uninstall":
            sub.add_argument("--drop-fences", action="store_true",
                             help="also drop schema fencing with its fence table (a stale "
                             "holder's fence is then forgotten)")
            continue
        sub.add_argument("--policy", help="the proxy's policy file (env PROXY_POLICY; default: "
                         "table T under lock T)")
        sub.add_argument("--tables", help="comma-separated allow-list (env PROXY_TABLES; "
                         "default: every table but partitions and inheritance children)")
        if action == "install":
            sub.add_argument("--exempt-role", action="append", default=[], metavar="ROLE",
                             help="a role whose writes skip the check (migrations); repeatable")
            sub.add_argument("--claim-role", action="append", default=[], metavar="ROLE",
                             help="a role that may call the claim functions (the proxy's role "
                             "unless it owns them, fenced_transaction's writers); repeatable; "
                             "every other role but the owner loses EXECUTE")


def _option(value: str | None, env: str) -> str | None:
    return value if value is not None else (os.environ.get(env) or None)


def _tables(text: str | None) -> list[str] | None:
    names = [t.strip() for t in (text or "").split(",") if t.strip()]
    return names or None


def run(args: argparse.Namespace) -> int:
    """Carry out ``db <action>``; the exit status (module doc)."""
    url = _option(args.database_url, "PROXY_DATABASE_URL")
    if url is None:
        print("resource-proxy db: give --database-url (or PROXY_DATABASE_URL)", file=sys.stderr)
        return 2
    if url.startswith("sqlite"):
        print("resource-proxy db: database-side fencing needs PostgreSQL (SQLite has no "
              "triggers that can see the proxy's claims)", file=sys.stderr)
        return 2
    try:
        policy = None if args.action == "uninstall" else load_policy(
            _option(args.policy, "PROXY_POLICY"))
        tables = None if args.action == "uninstall" else _tables(
            _option(args.tables, "PROXY_TABLES"))
        engine = engine_for(url)
    except (PolicyError, ValueError) as exc:
        print(f"resource-proxy db: {exc}", file=sys.stderr)
        return 2
    try:
        if args.action == "install":
            report = install(engine, policy, tables, exempt_roles=args.exempt_role,
                             claim_roles=args.claim_role)
        elif args.action == "check":
            report = check(engine, policy, tables)
        else:
            report = uninstall(engine, drop_fences=args.drop_fences)
    except DbFencingError as exc:
        print(f"resource-proxy db {args.action}: {exc}", file=sys.stderr)
        return 2
    except SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        print(f"resource-proxy db {args.action}: {reason}", file=sys.stderr)
        return 1
    finally:
        engine.dispose()
    lines = report.lines()
    if args.action == "uninstall":  # what it removed, then the count
        lines = [*report.changed, *lines]
    for line in lines:
        print(line)
    return 0 if args.action != "check" or report.ok else 1
