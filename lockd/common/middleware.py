"""``RequestMiddleware``: what both servers do around every request before any route runs.

Pure ASGI: no per-request task or body buffering.

* ``X-Request-Id``: taken from the request when it is 1-128 characters of ``A-Za-z0-9._:-``,
  else a new one is made (24 hex digits: a random per-process prefix and a counter); echoed on
  the response and attached to every log record written while the request runs
  (``lockd.common.logs.REQUEST_ID``).
* ``X-Lockd-Server``: every response names the server that sent it (``server``: ``lockd`` or
  ``resource-proxy``), so a client that reached the other one by mistake can say so.
* Headers: more than ``max_header_bytes`` in total (names + values) is ``431``.
* Bearer keys (``lockd.common.keys``): when ``api_keys`` is not empty, every path outside
  ``open_paths`` needs ``Authorization: Bearer <key>`` with a key of ``api_keys`` or
  ``admin_keys``; a missing or wrong key is ``401`` with ``WWW-Authenticate: Bearer``. The role
  found (``"admin"``, ``"client"`` or ``None``) is left in ``scope[ROLE]`` for routes that need
  more, and the identity that granted it (``KeySet.identify`` of the key, or ``cert:`` + a
  digest of the certificate subject) in ``scope[KEY_ID]`` (lockd binds an acquire's
  ``client_id`` to it).
* Scoped identities (``identities``: ``lockd.common.access.AccessFile``):
  a key or certificate subject listed there grants its entry's role (the file names it: it
  wins over ``api_keys``/``admin_keys``/``cert_roles`` listing the same credential); like
  ``api_keys``, a non-empty file turns access control on. Every request with an identity gets it in
  ``scope[IDENTITY]`` (keys of ``api_keys``/``admin_keys`` and ``cert_roles`` subjects as
  unscoped identities named by their key id), for the routes' scope checks.
* Certificate identities (mTLS, ``cert_roles``: ``lockd.common.tls.CertRoles``): a client
  certificate whose subject is listed stands for a client (or admin) key, so such a client
  needs no bearer key; listing client subjects turns access control on like ``api_keys``. The
  higher of the two roles (key, certificate) wins.
* Timing: ``scope[START]`` is the ``perf_counter()`` at arrival; ``on_response`` (if given) is
  called with ``(scope, status, seconds)`` when the response has started.
* At DEBUG level one line per request: method, path, status, milliseconds (never a body).
* A client that disconnects before its body is complete (``ClientDisconnect`` raised by the
  app) is one DEBUG line, not an ERROR with a traceback: any client can cause it.
"""

from __future__ import annotations

import itertools
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from starlette.requests import ClientDisconnect

from lockd.common.access import AccessFile, Identity, subject_key_id
from lockd.common.keys import KeySet, parse_bearer
from lockd.common.logs import REQUEST_ID
from lockd.common.problems import problem_bytes
from lockd.common.tls import CertRoles

__all__ = ["IDENTITY", "KEY_ID", "REQUEST_ID_KEY", "ROLE", "SERVER_HEADER", "START",
           "RequestMiddleware"]

log = logging.getLogger("lockd.http")

ROLE = "lockd.role"
"""The scope key of the request's role: ``"admin"``, ``"client"`` or ``None``."""
KEY_ID = "lockd.key_id"
"""The scope key of the identity that granted the role (absent without one)."""
IDENTITY = "lockd.identity"
"""The scope key of the request's ``lockd.common.access.Identity`` (absent without one)."""
START = "lockd.start"
SERVER_HEADER = b"x-lockd-server"
"""The response header naming the server (``lockd`` or ``resource-proxy``)."""
"""The scope key of the request's arrival, ``time.perf_counter()`` seconds."""
REQUEST_ID_KEY = "lockd.request_id"
"""The scope key of the request's id (as in ``X-Request-Id``)."""

_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class RequestMiddleware:
    """Request ids, header bound, bearer keys and timing around an ASGI app (see module doc).

    ``api_keys``/``admin_keys``: ``KeySet``s (empty ``api_keys``: no key needed).
    ``open_paths``: exact paths served without a key (e.g. ``/healthz``, ``/metrics``).
    ``on_auth_failure(reason)``: called with ``"missing"`` or ``"wrong"`` (for a metric).
    """

    def __init__(self, app: ASGIApp, *, api_keys: KeySet, admin_keys: KeySet,
                 open_paths: Iterable[str] = (), max_header_bytes: int = 16_384,
                 on_response: Callable[[Scope, int, float], None] | None = None,
                 on_auth_failure: Callable[[str], None] | None = None,
                 logger: logging.Logger | None = None, cert_roles: CertRoles | None = None,
                 identities: AccessFile | None = None, server: str = "lockd"):
        self.app = app
        self.server = server.encode("ascii")
        self.api_keys = api_keys
        self.admin_keys = admin_keys
        self.cert_roles = cert_roles or CertRoles()
        self.identities = identities or AccessFile("", ())
        self._enforced = bool(api_keys or self.cert_roles.clients or self.identities)
        self.open_paths = frozenset(open_paths)
        self.max_header_bytes = max_header_bytes
        self.on_response = on_response
        self.on_auth_failure = on_auth_failure
        self.log = logger or log
        self._keyed = bool(api_keys or admin_keys or self.cert_roles or self.identities)
        self._plain: dict[str, Identity] = {}
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
        scope[START] = start
        scope[REQUEST_ID_KEY] = request_id
        token = REQUEST_ID.set(request_id)
        send_with_id = _SendWithId(self.on_response, scope, request_id.encode(), start, send,
                                   self.server)
        try:
            if size > self.max_header_bytes:
                await _problem(send_with_id, 431, "headers_too_large",
                               "Request header fields too large",
                               f"request headers exceed {self.max_header_bytes} bytes")
                return
            role = scope[ROLE] = self._role(scope, authorization) if self._keyed else None
            if self._enforced and role is None and scope["path"] not in self.open_paths:
                reason = "missing" if parse_bearer(authorization) is None else "wrong"
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
                               send_with_id.status or "-", (time.perf_counter() - start) * 1000)
            REQUEST_ID.reset(token)

    def _role(self, scope: Scope, authorization: bytes | None) -> str | None:
        """``"admin"``, ``"client"`` or ``None``: the higher of the bearer key's role and the client
        certificate's; the identity that granted it goes to ``scope[KEY_ID]`` and
        ``scope[IDENTITY]``."""
        by_cert = self._cert_identity(scope)
        key = parse_bearer(authorization)
        if key is not None and (by_cert is None or by_cert.role != "admin"):
            found = self.identities.by_key(key)
            if found is not None:
                return self._grant(scope, found)
            for role, keys in (("admin", self.admin_keys), ("client", self.api_keys)):
                key_id = keys.identify(key)
                if key_id is not None:
                    return self._grant(scope, self._unscoped(key_id, role))
        return self._grant(scope, by_cert) if by_cert is not None else None

    def _cert_identity(self, scope: Scope) -> Identity | None:
        tls = (scope.get("extensions") or {}).get("tls") or {}
        subject = tls.get("client_cert_name")
        if subject is None:
            return None
        found = self.identities.by_subject(subject)
        if found is not None:
            return found
        role = self.cert_roles.role(scope) if self.cert_roles else None
        return self._unscoped(subject_key_id(subject), role) if role is not None else None

    @staticmethod
    def _grant(scope: Scope, identity: Identity) -> str:
        scope[KEY_ID] = identity.key_id
        scope[IDENTITY] = identity
        return identity.role

    def _unscoped(self, key_id: str, role: str) -> Identity:
        """The (cached: one per configured key or subject) identity of a key of ``api_keys`` /
        ``admin_keys`` or a subject of ``cert_roles``: named by its key id, all locks."""
        identity = self._plain.get(key_id)
        if identity is None or identity.role != role:
            identity = self._plain[key_id] = Identity(key_id, role, key_id)
        return identity


class _SendWithId:
    """The ``send`` the app gets: adds ``X-Request-Id`` to the response and reports it to
    ``on_response``; ``status`` is the response's (0 before it starts). An object with slots,
    not a closure: a request that lockd parks while it waits keeps it (~0.1 KB, not ~0.5)."""

    __slots__ = ("on_response", "scope", "rid", "start", "send", "status", "server")

    def __init__(self, on_response: Callable[[Scope, int, float], None] | None, scope: Scope,
                 rid: bytes, start: float, send: Send, server: bytes = b"lockd") -> None:
        self.on_response, self.scope, self.rid = on_response, scope, rid
        self.start, self.send, self.status, self.server = start, send, 0, server

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            status = self.status = message["status"]
            message["headers"] = [*message.get("headers", ()), (b"x-request-id", self.rid),
                                  (SERVER_HEADER, self.server)]
            if self.on_response is not None:
                self.on_response(self.scope, status, time.perf_counter() - self.start)
        await self.send(message)


async def _problem(send: Send, status: int, code: str, title: str, detail: str,
                   headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = problem_bytes(status, code, title, detail)
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/problem+json"),
        (b"content-length", str(len(body)).encode()), *(headers or ())]})
    await send({"type": "http.response.body", "body": body})
