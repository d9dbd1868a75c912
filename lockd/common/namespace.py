"""Who owns a name: the one table of lockd's namespace and the one check every route calls.

Every primitive's tokens name locks of one namespace. Plain locks and elections share the
unreserved names (an election's leader IS the exclusive holder of lock ``{name}``); a primitive
whose tokens name locks of its own reserves a prefix (semaphores: ``sem/{name}/{slot}``). A name
whose token lock lies under another primitive's prefix is refused, so no primitive can mint a
token for a lock another one fences. A new primitive is one row of ``PRIMITIVES``
(docs/primitives.md, "One namespace").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lockd.common.names import LOCK_NAME_RULE, is_lock_name

__all__ = ["ELECTION", "LOCK", "PRIMITIVES", "SEMAPHORE", "NameRefused", "Primitive", "check",
           "mints", "owner_of", "token_lock", "token_name"]


@dataclass(frozen=True, slots=True)
class Primitive:
    """One row of the namespace: a primitive, the lock-name prefix only it mints tokens under
    (``""``: none, it shares the unreserved names), the lock name of its tokens (a format of
    ``name`` and ``slot``) and the call that takes one (named when a name is refused)."""

    kind: str
    reserves: str
    token: str
    take: str


LOCK = Primitive("lock", "", "{name}", "acquire a lock with POST /v1/locks/{name}/acquire")
ELECTION = Primitive("election", "", "{name}",
                     "campaign with POST /v1/elections/{name}/campaign")
SEMAPHORE = Primitive("semaphore", "sem/", "sem/{name}/{slot}",
                      "take a permit with POST /v1/semaphores/{name}/acquire")

PRIMITIVES: tuple[Primitive, ...] = (LOCK, ELECTION, SEMAPHORE)
"""Every primitive of lockd; each non-empty ``reserves`` is a reservation of the namespace."""

_RESERVING = tuple(sorted((p for p in PRIMITIVES if p.reserves),
                          key=lambda p: len(p.reserves), reverse=True))  # the longest wins
_TOKEN_RE = {p.kind: re.compile(re.escape(p.token).replace(re.escape("{name}"), "(?P<name>.+)")
                                .replace(re.escape("{slot}"), "[0-9]+")) for p in _RESERVING}


class NameRefused(ValueError):
    """``name`` is not one ``primitive`` may use: ``detail`` says why; ``owner`` is the kind of
    the primitive that reserves its lock (``None``: not a lock name at all)."""

    def __init__(self, detail: str, *, name: str, owner: str | None = None,
                 reserved: str | None = None) -> None:
        super().__init__(detail)
        self.detail, self.name, self.owner, self.reserved = detail, name, owner, reserved


def owner_of(lock: str) -> Primitive | None:
    """The primitive whose reservation covers lock name ``lock``; ``None``: unreserved (the
    names of plain locks and elections)."""
    for primitive in _RESERVING:
        if lock.startswith(primitive.reserves):
            return primitive
    return None


def token_lock(primitive: Primitive, name: str, slot: int = 0) -> str:
    """The lock name a token of ``primitive``'s ``name`` carries (a semaphore: of ``slot``)."""
    return primitive.token.format(name=name, slot=slot)


def token_name(lock: str) -> tuple[Primitive, str] | None:
    """The reserving primitive and its name whose token lock ``lock`` is (``sem/{name}/{slot}``:
    ``(SEMAPHORE, name)``); ``None`` for any other lock (a plain lock's or an election's)."""
    owner = owner_of(lock)
    match = _TOKEN_RE[owner.kind].fullmatch(lock) if owner is not None else None
    return (owner, match["name"]) if match is not None else None


def mints(primitive: Primitive, lock: str) -> bool:
    """Whether ``primitive`` may sign a token for lock ``lock``: the lock lies under its own
    reservation, or under none if it reserves nothing."""
    owner = owner_of(lock)
    return owner is primitive if primitive.reserves else owner is None


_ACCEPTED: dict[tuple[int, str, int], None] = {}
"""Recently accepted (id of the primitive, name, slots): a hot lock's name is checked on each of
its requests (twice: by the route and by its service); the check is a pure function of these.
By id, and only for ``PRIMITIVES`` (constants, so an id is never reused): hashing the frozen
dataclass costs more than the cache saves."""
_ACCEPTED_MAX = 4096
_CACHED = frozenset(id(p) for p in PRIMITIVES)  # alive for good: no other object has their id


def check(primitive: Primitive, name: object, slots: int = 1) -> str:
    """``name``, once ``primitive`` may use it: a lock name whose token locks (a semaphore's:
    up to slot ``slots - 1``) are lock names that ``primitive`` mints. Raises ``NameRefused``."""
    pid = id(primitive)
    key = (pid, name, slots) if type(name) is str and pid in _CACHED else None
    if key is not None and key in _ACCEPTED:
        return name  # type: ignore[return-value]
    _check(primitive, name, slots)
    if key is not None:
        if len(_ACCEPTED) >= _ACCEPTED_MAX:
            _ACCEPTED.clear()
        _ACCEPTED[key] = None
    return name  # type: ignore[return-value]


def _check(primitive: Primitive, name: object, slots: int) -> None:
    if not is_lock_name(name):
        prefix = "" if primitive is LOCK else f"{primitive.kind} names follow the lock-name rule: "
        raise NameRefused(prefix + LOCK_NAME_RULE, name=str(name)[:300])
    assert isinstance(name, str)
    lock = token_lock(primitive, name, max(0, slots - 1))
    if lock != name and not is_lock_name(lock):
        raise NameRefused(f"{primitive.kind} name too long: the lock name of its last slot, "
                          f"{primitive.token.format(name='{name}', slot=max(0, slots - 1))}, "
                          "must fit 255 characters", name=name)
    if not mints(primitive, lock):
        owner = owner_of(lock)
        assert owner is not None
        raise NameRefused(
            f"lock names under {owner.reserves!r} belong to {owner.kind}s (their locks are "
            f"{owner.token}), so {name!r} cannot name a{'n' if primitive.kind[0] in 'ae' else ''}"
            f" {primitive.kind}: {owner.take}", name=name, owner=owner.kind,
            reserved=owner.reserves)
