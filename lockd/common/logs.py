"""Logs of both servers: one line per record (text or JSON), with secrets redacted.

``configure_logging(level, format)`` sends every record (uvicorn's included) to stderr.
``format="json"``: one JSON object a line: ``ts``, ``level``, ``logger``, ``msg``, ``request_id``
and ``exc`` (a traceback). ``format="text"``: the classic one-line format with ``[request_id]``
when there is one. Either way the FINAL line passes through ``redact``, which replaces compact
JWS tokens, ``Bearer`` credentials and lease-id-shaped words (32 URL-safe base64 characters with
upper- and lower-case letters) by ``[redacted]``. ``REQUEST_ID`` holds the id of the request
being served (set by ``lockd.common.middleware.RequestMiddleware``). Third-party request
loggers (``QUIET``: httpx's one INFO line per request, e.g. the proxy fetching lockd's keys) log
from WARNING up unless the level is ``debug``.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
import time
from typing import Any, Literal

__all__ = ["QUIET", "REQUEST_ID", "configure_logging", "redact"]

QUIET = ("httpx", "httpcore")
"""Loggers kept to WARNING at any level but debug: their INFO lines are per request."""

REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
"""The id of the request being served (``None`` outside a request)."""

_JWS = re.compile(r"eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")
_BEARER = re.compile(r"(?i)\b(bearer)\s+[^\s\"',;]+")
_WORD32 = re.compile(r"(?<![A-Za-z0-9_-])[A-Za-z0-9_-]{32}(?![A-Za-z0-9_-])")
_UPPER = re.compile(r"[A-Z]")
_LOWER = re.compile(r"[a-z]")


def _secretish(match: re.Match[str]) -> str:
    word = match.group(0)
    return "[redacted]" if _UPPER.search(word) and _LOWER.search(word) else word


def redact(text: str) -> str:
    """``text`` with tokens (compact JWS), ``Bearer`` credentials and lease-id-shaped words
    replaced by ``[redacted]`` (see the module docstring)."""
    if "eyJ" in text:
        text = _JWS.sub("[redacted-token]", text)
    text = _BEARER.sub(r"\1 [redacted]", text)
    return _WORD32.sub(_secretish, text)


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get()
        return True


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        rid = getattr(record, "request_id", None)
        if rid:
            head, sep, rest = line.partition(": ")
            line = f"{head} [{rid}]{sep}{rest}" if sep else f"{line} [{rid}]"
        return redact(line)


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid = getattr(record, "request_id", None)
        if rid:
            doc["request_id"] = rid
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return redact(json.dumps(doc, ensure_ascii=False, default=str))


def configure_logging(level: str = "info", fmt: Literal["text", "json"] = "text") -> None:
    """Send every log record (uvicorn's included) to stderr in ``fmt``, redacted, at ``level``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_RequestIdFilter())
    if fmt == "json":
        formatter: logging.Formatter = _JsonFormatter()
        formatter.converter = time.gmtime
    else:
        formatter = _TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler.setFormatter(formatter)
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    quiet = logging.NOTSET if level.lower() == "debug" else logging.WARNING
    for name in QUIET:
        logging.getLogger(name).setLevel(quiet)
