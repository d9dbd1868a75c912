"""The name check every route of every primitive calls: ``lockd.common.namespace``'s one rule,
its refusal as a 422 problem."""

from __future__ import annotations

from typing import Any

from lockd.common import namespace
from lockd.common.names import PREFIX_RULE, is_name_prefix
from lockd.common.namespace import LOCK, Primitive
from lockd.server.errors import InvalidRequest

__all__ = ["check_name", "check_prefix"]


def check_name(name: str, primitive: Primitive = LOCK, slots: int = 1) -> None:
    """``InvalidRequest`` (422) unless ``primitive`` may use ``name`` (``namespace.check``: the
    lock-name rule and every reservation; the problem names the ``owner`` and the ``reserved``
    prefix of a reserved name). ``slots``: a semaphore's limit (its last slot's lock must be a
    lock name too)."""
    try:
        namespace.check(primitive, name, slots)
    except namespace.NameRefused as refused:
        extra: dict[str, Any] = {primitive.kind: refused.name[:300]}
        if primitive.token == "{name}":  # the name is the lock its tokens carry
            extra["lock"] = refused.name[:300]
        if refused.owner:
            extra.update(owner=refused.owner, reserved=refused.reserved)
        raise InvalidRequest(refused.detail, **extra) from None


def check_prefix(prefix: str) -> str:
    """``prefix``, once it may start lock names (lists, event streams); else ``InvalidRequest``."""
    if not is_name_prefix(prefix):
        raise InvalidRequest(PREFIX_RULE)
    return prefix
