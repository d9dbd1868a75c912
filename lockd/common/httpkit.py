"""HTTP plumbing both servers use: bearer API keys, request ids, bounded headers, problem
responses, and logs (text or JSON) with every secret-shaped string redacted.

Shared by lockd's server and ``resource_proxy`` (it imports neither): key comparison and
redaction are security code, and one copy of them is easier to keep right.

API keys
    ``KeySet`` holds SHA-256 digests of the configured keys. ``KeySet.matches`` hashes the
    presented key and compares it with EVERY configured digest with ``hmac.compare_digest``
    (no early exit), so neither the answer time nor the key length tells an attacker how close
    a guess was. Keys come from a comma/whitespace separated setting and/or a file with one key
    per line (``#`` starts a comment); see ``load_keys``.

Requests (``OpsMiddleware``, pure ASGI: no per-request task or body buffering)
    * ``X-Request-Id``: taken from the request when it is 1-128 characters of
      ``A-Za-z0-9._:-``, else a new one is made (24 hex digits: a random per-process prefix and
      a counter); echoed on the response and attached to every
      log record written while the request runs (``request_id``).
    * Headers: more than ``max_header_bytes`` in total (names + values) is ``431``.
    * Bearer keys: when ``api_keys`` is not empty, every path outside ``open_paths`` needs
      ``Authorization: Bearer <key>`` with a key of ``api_keys`` or ``admin_keys``; a missing
      or wrong key is ``401`` with ``WWW-Authenticate: Bearer``. The role found (``"admin"``,
      ``"client"`` or ``None``) is left in ``scope["ops.role"]`` for routes that need more, and
      the identity that granted it (``KeySet.identify`` of the key, or ``cert:`` + a digest of
      the certificate subject) in ``scope["ops.key_id"]`` (lockd binds an acquire's
      ``client_id`` to it).
    * Certificate identities (mTLS, ``cert_roles``: ``lockd.common.tls.CertRoles``): a client
      certificate whose subject is listed stands for a client (or admin) key, so such a client
      needs no bearer key; listing client subjects turns access control on like ``api_keys``.
      The higher of the two roles (key, certificate) wins.
    * Timing: ``scope["ops.start"]`` is the ``perf_counter()`` at arrival; ``on_response``
      (if given) is called with ``(scope, status, seconds)`` when the response has started.
    * At DEBUG level one line per request: method, path, status, milliseconds (never a body).
    * A client that disconnects before its body is complete (``ClientDisconnect`` raised by
      the app) is one DEBUG line, not an ERROR with a traceback: any client can cause it.

Logs (``configure_logging``)
    ``format="json"``: one JSON object a line: ``ts``, ``level``, ``logger``, ``msg``,
    ``request_id`` and ``exc`` (a traceback). ``format="text"``: the classic one-line format with
    ``[request_id]`` when there is one. Either way the FINAL line passes through ``redact``,
    which replaces compact JWS tokens, ``Bearer`` credentials and lease-id-shaped words
    (32 URL-safe base64 characters with upper- and lower-case letters) by ``[redacted]``.
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import itertools
import json
import logging
import re
import secrets
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, MutableMapping
from pathlib import Path
from typing import Any, Literal

from starlette.requests import ClientDisconnect
from starlette.responses import Response

from lockd.common.problems import PROBLEM_JSON, ProblemError, problem_bytes
from lockd.common.tls import CertRoles

__all__ = [
    "KeySet",
    "OpsMiddleware",
    "REQUEST_ID",
    "bearer_key",
    "configure_logging",
    "load_keys",
    "bounded_body",
    "error_response",
    "problem_response",
    "redact",
]

log = logging.getLogger("lockd.http")

REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
"""The id of the request being served (``None`` outside a request)."""

_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


# --- keys -----------------------------------------------------------------------------------


def load_keys(inline: Iterable[str] | str | None, file: str | Path | None) -> list[str]:
    """Keys from ``inline`` (strings, or one string split on commas/whitespace) plus ``file``
    (one key per line; blank lines and ``#`` comments ignored). Raises ``OSError`` if the file
    cannot be read, ``ValueError`` for a key shorter than 8 characters."""
    keys: list[str] = []
    if isinstance(inline, str):
        inline = [inline]
    for item in inline or ():
        keys += [k for k in re.split(r"[\s,]+", item) if k]
    if file:
        for line in Path(file).read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                keys.append(line)
    for key in keys:
        if len(key) < 8:
            raise ValueError("API keys must be at least 8 characters long")
    return keys


class KeySet:
    """A set of secret keys, checked in constant time (see the module docstring)."""

    __slots__ = ("_digests",)

    def __init__(self, keys: Iterable[str] = ()):
        self._digests = tuple({hashlib.sha256(k.encode()).digest() for k in keys})

    def __bool__(self) -> bool:
        return bool(self._digests)

    def __len__(self) -> int:
        return len(self._digests)

    def __repr__(self) -> str:  # never the keys
        return f"KeySet({len(self._digests)} key(s))"

    def matches(self, presented: str | bytes | None) -> bool:
        """Whether ``presented`` is one of the keys; compares against all of them."""
        return self.identify(presented) is not None

    def identify(self, presented: str | bytes | None) -> str | None:
        """A stable identity of ``presented`` if it is one of the keys (16 hex digits of its
        SHA-256: the same on every replica, not the key), else ``None``. Constant time."""
        if presented is None:
            return None
        if isinstance(presented, str):
            presented = presented.encode("utf-8", "surrogateescape")
        digest = hashlib.sha256(presented).digest()
        found = False
        for known in self._digests:
            found |= hmac.compare_digest(known, digest)
        return digest.hex()[:16] if found else None


def bearer_key(scope: Scope) -> bytes | None:
    """The credential of ``Authorization: Bearer <key>``; ``None`` if absent or not Bearer."""
    for name, value in scope.get("headers") or ():
        if name == b"authorization":
            return _bearer(value)
    return None


def _bearer(value: bytes | None) -> bytes | None:
    if value is None:
        return None
    scheme, _, credential = value.strip().partition(b" ")
    if scheme.lower() == b"bearer" and credential.strip():
        return credential.strip()
    return None


def problem_response(status: int, code: str, title: str, detail: str,
                     extra: dict[str, Any] | None = None,
                     headers: Mapping[str, str] | None = None) -> Response:
    """An ``application/problem+json`` response (see ``lockd.common.problems``)."""
    return Response(problem_bytes(status, code, title, detail, extra), status_code=status,
                    headers=headers, media_type=PROBLEM_JSON)


async def bounded_body(receive_stream: AsyncIterator[bytes], declared: str | None, limit: int,
                       too_large: Callable[[str], Exception]) -> bytes:
    """The whole request body, refused past ``limit`` bytes before or while it is read.

    ``receive_stream``: the body chunks (Starlette's ``request.stream()``); ``declared``: the
    Content-Length header, if any; ``too_large(detail)`` makes the error raised (each server's
    413 ``PayloadTooLarge``). Nothing beyond the limit is buffered.
    """
    if declared is not None and declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise too_large(f"request body exceeds {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in receive_stream:
        size += len(chunk)
        if size > limit:
            raise too_large(f"request body exceeds {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def error_response(error: ProblemError, headers: Mapping[str, str] | None = None) -> Response:
    """The problem response of ``error`` (its status, code, title, detail and extra members)."""
    return problem_response(error.status, error.code, error.title, error.detail, error.extra,
                            headers)


# --- the middleware -------------------------------------------------------------------------


class OpsMiddleware:
    """Request ids, header bound, bearer keys and timing around an ASGI app (see module doc).

    ``api_keys``/``admin_keys``: ``KeySet``s (empty ``api_keys``: no key needed).
    ``open_paths``: exact paths served without a key (e.g. ``/healthz``, ``/metrics``).
    ``on_auth_failure(reason)``: called with ``"missing"`` or ``"wrong"`` (for a metric).
    """

    def __init__(self, app: ASGIApp, *, api_keys: KeySet, admin_keys: KeySet,
                 open_paths: Iterable[str] = (), max_header_bytes: int = 16_384,
                 on_response: Callable[[Scope, int, float], None] | None = None,
                 on_auth_failure: Callable[[str], None] | None = None,
                 logger: logging.Logger | None = None, cert_roles: CertRoles | None = None):
        self.app = app
        self.api_keys = api_keys
        self.admin_keys = admin_keys
        self.cert_roles = cert_roles or CertRoles()
        self._enforced = bool(api_keys or self.cert_roles.clients)
        self.open_paths = frozenset(open_paths)
        self.max_header_bytes = max_header_bytes
        self.on_response = on_response
        self.on_auth_failure = on_auth_failure
        self.log = logger or log
        self._keyed = bool(api_keys or admin_keys or self.cert_roles)
        self._id_prefix = secrets.token_hex(8)  # request ids: unique, cheap (no urandom each)
        self._ids = itertools.count(1)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        size = 0
        request_id: str | None = None
        authorization: bytes | None = None
        for name, value in scope["headers"]:
            size += len(name) + len(value)
            if name == b"x-request-id" and request_id is None:
                text = value.decode("latin-1")
                if _REQUEST_ID_RE.match(text):
                    request_id = text
            elif name == b"authorization" and authorization is None:
                authorization = value
        if request_id is None:
            request_id = f"{self._id_prefix}{next(self._ids):08x}"
        scope["ops.start"] = start
        scope["ops.request_id"] = request_id
        token = REQUEST_ID.set(request_id)
        rid = request_id.encode()
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), (b"x-request-id", rid)]
                if self.on_response is not None:
                    self.on_response(scope, status, time.perf_counter() - start)
            await send(message)

        try:
            if size > self.max_header_bytes:
                await _problem(send_with_id, 431, "headers_too_large",
                               "Request header fields too large",
                               f"request headers exceed {self.max_header_bytes} bytes")
                return
            role = scope["ops.role"] = self._role(scope, authorization) if self._keyed else None
            if self._enforced and role is None and scope["path"] not in self.open_paths:
                reason = "missing" if _bearer(authorization) is None else "wrong"
                if self.on_auth_failure is not None:
                    self.on_auth_failure(reason)
                detail = ("this call needs an API key: send Authorization: Bearer <key>"
                          if reason == "missing" else "the API key is not valid")
                await _problem(send_with_id, 401, "unauthorized", "Unauthorized", detail,
                               [(b"www-authenticate", b'Bearer realm="lockd"')])
                return
            await self.app(scope, receive, send_with_id)
        except ClientDisconnect:  # the client left mid-body: nobody to answer, nothing to log
            self.log.debug("client disconnected during the body of %s %s", scope.get("method"),
                           scope.get("path"))
        finally:
            if self.log.isEnabledFor(logging.DEBUG):
                self.log.debug("%s %s -> %s in %.1f ms", scope.get("method"), scope.get("path"),
                               status or "-", (time.perf_counter() - start) * 1000)
            REQUEST_ID.reset(token)

    def _role(self, scope: Scope, authorization: bytes | None) -> str | None:
        """``"admin"``, ``"client"`` or ``None``: the higher of the bearer key's role and the client
        certificate's; the identity that granted it goes to ``ops.key_id``."""
        by_cert = self.cert_roles.role(scope) if self.cert_roles else None
        key = _bearer(authorization)
        if key is not None and by_cert != "admin":
            for role, keys in (("admin", self.admin_keys), ("client", self.api_keys)):
                identity = keys.identify(key)
                if identity is not None:
                    scope["ops.key_id"] = identity
                    return role
        if by_cert is not None:
            subject = scope["extensions"]["tls"]["client_cert_name"]
            scope["ops.key_id"] = "cert:" + hashlib.sha256(subject.encode()).hexdigest()[:16]
        return by_cert


async def _problem(send: Send, status: int, code: str, title: str, detail: str,
                   headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = problem_bytes(status, code, title, detail)
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/problem+json"),
        (b"content-length", str(len(body)).encode()), *(headers or ())]})
    await send({"type": "http.response.body", "body": body})


# --- logs -----------------------------------------------------------------------------------

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
