"""The lock-name rule, one copy for lockd, its client library and the proxy's fence routes.

A lock name is 1-255 characters of ``A-Za-z0-9._:/-`` whose ``/``-separated segments are neither
empty nor ``.`` nor ``..``. The segment rule exists because names travel in URL paths: HTTP
clients (httpx, curl, browsers) resolve ``a/../b`` to ``b`` and many collapse ``a//b`` before
sending, so such a name would mean one lock on one path and another lock on the next. Refusing
them (422) makes a name mean the same thing on every path.
"""

from __future__ import annotations

import re

__all__ = ["LOCK_NAME_RULE", "PREFIX_RULE", "bad_segment", "is_lock_name", "is_name_prefix"]

LOCK_NAME_RULE = ("lock name must be 1-255 characters of A-Z a-z 0-9 . _ : / - with no empty, "
                  "'.' or '..' segment")
PREFIX_RULE = "prefix must be at most 255 characters of A-Z a-z 0-9 . _ : / -"
_CHARS = re.compile(r"[A-Za-z0-9._:/-]{1,255}")
_PREFIX = re.compile(r"[A-Za-z0-9._:/-]{0,255}")


def bad_segment(name: str) -> bool:
    """Whether ``name`` has an empty, ``.`` or ``..`` segment (leading/trailing/double ``/``)."""
    return any(seg in ("", ".", "..") for seg in name.split("/"))


def is_lock_name(name: object) -> bool:
    """Whether ``name`` is a valid lock name (see the module docstring)."""
    return isinstance(name, str) and _CHARS.fullmatch(name) is not None and not bad_segment(name)


def is_name_prefix(prefix: object) -> bool:
    """Whether ``prefix`` may start lock names: 0-255 characters of the names' alphabet."""
    return isinstance(prefix, str) and _PREFIX.fullmatch(prefix) is not None
