"""The PostgreSQL store URL: libpq's part and the store's own query parameters.

``postgresql[+psycopg]://user:pass@host:port/db?…``; ``pool_min``, ``pool_max``,
``pool_timeout``, ``op_timeout``, ``prepare_threshold`` and ``batch`` are the store's and are removed
before libpq sees the URL (docs/stores/postgres.md, "URL").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["OWN_PARAMS", "libpq_url", "param"]

OWN_PARAMS = frozenset({"pool_min", "pool_max", "pool_timeout", "op_timeout",
                        "prepare_threshold", "batch"})
"""The query parameters the store takes for itself."""

T = TypeVar("T")


def libpq_url(url: str) -> tuple[str, dict[str, str]]:
    """Split a store URL into (libpq URL, the store's own query parameters).

    Accepts ``postgresql://``, ``postgres://`` and ``postgresql+psycopg://``.
    Raises ``ValueError`` for any other scheme.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("postgresql", "postgres", "postgresql+psycopg", "postgres+psycopg"):
        raise ValueError(f"not a PostgreSQL URL (scheme {parts.scheme!r})")
    query = parse_qsl(parts.query, keep_blank_values=True)
    own = {k: v for k, v in query if k in OWN_PARAMS}
    rest = [(k, v) for k, v in query if k not in OWN_PARAMS]
    return urlunsplit(("postgresql", parts.netloc, parts.path, urlencode(rest), "")), own


def param(own: dict[str, str], name: str, default: T, kind: Callable[[str], T]) -> T:
    """The store URL's query parameter ``name`` as ``kind`` (``int``/``float``), else
    ``default``; ``ValueError`` naming the parameter for a value that is not one."""
    if name not in own:
        return default
    try:
        return kind(own[name])
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise ValueError(f"PostgreSQL store URL: {name}={own[name]!r} is not {what}") from None
