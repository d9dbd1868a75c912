"""RFC 9457 problem details, the error shape of both servers, and the base of both error trees.

Every error a client can cause is a ``ProblemError`` subclass (lockd's ``LockdError``, the proxy's
``ProxyError``) with class defaults ``status``, ``code`` (the problem slug) and ``title``, a human
``detail`` and extension members (``extra``) that go into the body next to the standard ones::

    {"type": "urn:lockd:problem:<code>", "title": ..., "status": ..., "detail": ..., "code": ...}

Pure Python: no web framework here, so stores may raise these errors (``lockd.common.responses``
turns them into responses).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

__all__ = ["PROBLEM_JSON", "PROBLEM_TYPE_PREFIX", "ProblemError", "problem_body", "problem_bytes"]

PROBLEM_TYPE_PREFIX = "urn:lockd:problem:"
PROBLEM_JSON = "application/problem+json"


def problem_body(status: int, code: str, title: str, detail: str,
                 extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """A problem-details body; ``extra`` members are added after the standard ones."""
    body: dict[str, Any] = {"type": PROBLEM_TYPE_PREFIX + code, "title": title, "status": status,
                            "detail": detail, "code": code}
    if extra:
        body.update(extra)
    return body


def problem_bytes(status: int, code: str, title: str, detail: str,
                  extra: dict[str, Any] | None = None) -> bytes:
    """``problem_body`` as compact JSON bytes. Non-ASCII is escaped, so any text (a lone surrogate
    included) can be rendered; values JSON does not know (``Decimal``) are written as strings."""
    return json.dumps(problem_body(status, code, title, detail, extra), separators=(",", ":"),
                      default=str).encode()


class ProblemError(Exception):
    """Base of every error either server maps to a problem. 500 ``internal`` unless overridden."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal"
    title: ClassVar[str] = "Internal error"

    def __init__(self, detail: str | None = None, **extra: Any):
        self.detail = detail or self.title
        self.extra = extra
        super().__init__(self.detail)

    def with_extra(self, **extra: Any) -> ProblemError:
        """This error with more extension members (existing ones win); returns ``self``."""
        self.extra = {**extra, **self.extra}
        return self

    def problem(self) -> dict[str, Any]:
        """The problem-details body (``application/problem+json``)."""
        return problem_body(self.status, self.code, self.title, self.detail, self.extra)
