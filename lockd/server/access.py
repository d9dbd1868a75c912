"""Who may use which lock: the access file, and the ONE function that decides (``authorize``).

The access file (``lockd serve --access-file FILE``, ``LOCKD_ACCESS_FILE``) is YAML::

    clients:
      - name: billing                 # 1-64 of A-Za-z0-9._-; in problems, audit lines, metrics
        key_sha256: 9f86d08...        # or key: <the key itself>, or subject: CN=billing,O=Acme
        prefixes: ["billing/"]        # lock-name prefixes it may use; [""] means every lock
    admins:
      - name: oncall
        subject: CN=oncall,O=Acme     # admins use every lock and may force-release

Each entry has exactly one of ``key`` (at least 8 characters), ``key_sha256`` (64 hex digits:
the key's SHA-256, so the file need not hold the secret) or ``subject`` (a client-certificate
subject, RFC 4514; needs mTLS). An unknown field, a duplicate name, key or subject, an empty or
missing ``prefixes`` of a client, a prefix that does not end with ``/`` (a prefix covers whole
name segments: ``team-a`` would also cover ``team-ab/...``), or ``prefixes`` on an admin is
refused at start
(``lockd.common.access.AccessFileError``, one line; ``lockd serve`` exits 2): the shared parser
of ``lockd.common.access`` reads it, with ``prefixes`` as the scope field and lockd's rules for
names and prefixes (``_LOCKD_RULES``). Keys of ``LOCKD_API_KEYS`` /
``LOCKD_ADMIN_KEYS`` and ``LOCKD_CERT_*`` subjects stay valid as unscoped identities (a key or
subject the file also lists is the file's identity: the file names it).

Decisions are made by name only: ``authorize`` answers 403 ``forbidden_lock`` for a lock outside
the caller's prefixes whether or not the lock exists, so ``GET /v1/locks/{name}`` answers 403
too (not 404): the answer depends only on the name and the caller's own scope, which the caller
already knows, so it tells nothing about other teams' locks. Lists and event streams are
narrowed to the caller's prefixes (``visible_prefixes``, ``covers``, ``visibility``).

Every decision is taken on the name the identity was granted (``granted_name``): a semaphore's
slot lock ``sem/{name}/{slot}`` (its permits' events, the slot's event stream) is judged by the
semaphore's ``name``, so a team scoped to ``team-b/`` sees its own semaphores and no other's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from lockd.common.access import AccessFile, AccessFileError, Identity, load_access
from lockd.common.access import parse_access as parse_any_access
from lockd.common.middleware import IDENTITY
from lockd.common.names import is_name_prefix
from lockd.common.namespace import token_name
from lockd.server.errors import ForbiddenLock

__all__ = ["access_file_problem", "authorize", "covers", "granted_name", "identity_name",
           "load_access_file", "parse_access", "visibility", "visible_prefixes"]

ANONYMOUS = "anonymous"
"""The identity name of a request to a lockd that needs no key."""

def _prefix_problem(prefix: str) -> str | None:
    """Why ``prefix`` cannot be a client's prefix (``None``: it can)."""
    if not is_name_prefix(prefix):
        return f"prefix {prefix!r} is not 0-255 characters of A-Za-z0-9._:/-"
    if prefix and not prefix.endswith("/"):
        return (f"prefix {prefix!r} must end with '/' (a prefix covers whole name segments: "
                f"{prefix!r} would also cover {prefix + 'x'!r}...; '' covers every lock)")
    return None


_LOCKD_RULES: dict[str, Any] = dict(
    scope_field="prefixes", all_item="", name_re=re.compile(r"[A-Za-z0-9._-]{1,64}"),
    name_rule="1-64 characters of A-Za-z0-9._-", check_item=_prefix_problem)
"""lockd's rules for the shared access-file parser (``lockd.common.access``)."""


def load_access_file(path: str | Path) -> AccessFile:
    """The identities of the access file at ``path`` (see the module docstring). Raises
    ``AccessFileError`` for an unreadable file or any entry that breaks the rules."""
    return load_access(path, **_LOCKD_RULES)


def parse_access(doc: Any, source: str = "access file") -> AccessFile:
    """The identities of a parsed access document (``load_access_file`` without the reading)."""
    return parse_any_access(doc, source=source, **_LOCKD_RULES)


def access_file_problem(path: str | Path | None) -> str | None:
    """The one line saying why the access file at ``path`` is unusable; ``None`` if it is
    usable or there is none (the CLI prints it and exits 2 before starting)."""
    if path is None:
        return None
    try:
        load_access_file(path)
    except AccessFileError as exc:
        return str(exc)
    return None


# --- decisions -----------------------------------------------------------------------------------


def granted_name(lock: str) -> str:
    """The name access to ``lock`` is decided on: a reserved lock is its primitive's name (a
    semaphore slot's ``sem/{name}/{slot}``: ``name``), any other lock itself."""
    owned = token_name(lock)
    return lock if owned is None else owned[1]


def authorize(scope: Any, locks: str | Iterable[str]) -> None:
    """Raise ``ForbiddenLock`` (403) unless the request's identity may use every lock of
    ``locks`` (one name or several: a set is all or nothing, the first lock outside is named).
    Unscoped identities and requests without one pass with one dict lookup."""
    identity: Identity | None = scope.get(IDENTITY)
    if identity is None or identity.scope is None:
        return
    prefixes = identity.scope
    for lock in (locks,) if isinstance(locks, str) else locks:
        if not granted_name(lock).startswith(prefixes):
            raise ForbiddenLock(
                f"identity {identity.name!r} may not use lock {lock!r}: it is outside its "
                f"prefixes", lock=lock, identity=identity.name)


def covers(scope: Any, lock: str) -> bool:
    """Whether the request's identity may see ``lock`` (see ``authorize``)."""
    identity: Identity | None = scope.get(IDENTITY)
    return (identity is None or identity.scope is None
            or granted_name(lock).startswith(identity.scope))


def visibility(scope: Any) -> Callable[[str], bool] | None:
    """``covers`` for many locks of one request (an event stream's filter): ``None`` when the
    identity sees every lock."""
    identity: Identity | None = scope.get(IDENTITY)
    if identity is None or identity.scope is None:
        return None
    prefixes = identity.scope
    return lambda lock: granted_name(lock).startswith(prefixes)


def visible_prefixes(scope: Any, prefix: str) -> tuple[str, ...]:
    """The prefixes to list for a request for names starting with ``prefix``, narrowed to the
    identity's scope: disjoint (none is a prefix of another) and sorted, so their name ranges
    follow each other in name order and one cursor pages through all of them."""
    identity: Identity | None = scope.get(IDENTITY)
    if identity is None or identity.scope is None:
        return (prefix,)
    if prefix.startswith(identity.scope):
        return (prefix,)
    inside = sorted(p for p in identity.scope if p.startswith(prefix))
    kept: list[str] = []
    for p in inside:
        if not kept or not p.startswith(kept[-1]):
            kept.append(p)
    return tuple(kept)


def identity_name(scope: Any) -> str:
    """The name of the request's identity (``anonymous`` on a lockd that needs no key)."""
    identity: Identity | None = scope.get(IDENTITY)
    return identity.name if identity is not None else ANONYMOUS
