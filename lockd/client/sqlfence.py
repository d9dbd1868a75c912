"""Fenced SQL: run your own SQL in one PostgreSQL transaction that first claims a lease's fences.

``fenced_transaction`` (blocking) and ``async_fenced_transaction`` (asyncio) take a psycopg 3
``Connection``/``AsyncConnection`` or a SQLAlchemy ``Connection``/``Session``/``AsyncConnection``
/``AsyncSession`` (``scoped_session`` too) and a lease::

    with client.lock("accounts/42", ttl=10) as lease:
        with fenced_transaction(conn, lease) as claims:       # conn: a psycopg Connection
            conn.execute("UPDATE accounts SET balance = balance - 5 WHERE id = 42")
        # committed here; a newer holder's claim made this StaleTokenError, nothing committed

    async with async_fenced_transaction(session, lease):      # an AsyncSession
        session.add(Report(id=7, state="done"))               # flushed and committed on exit

Steps: (1) the lease's token is verified **offline** against lockd's public keys; the locks and
fences claimed are the token's verified claims, never the lease object's own fields; (2) a
transaction is opened; (3) every lock of the token is claimed in name order (code-point order, as
the proxy locks fence rows, so two claimers of overlapping sets never deadlock), for what the
token may do with it (``lockd.common.fencerule``): ``SELECT fencing.claim(lock, fence)`` for a
lock it holds exclusively, ``fencing.claim_read`` for one it holds shared (a read lease: the
same raise of the highest to its fence, but a claim under which the row triggers write
nothing); (4) the block runs; (5) COMMIT. An exception in any step rolls back and is
re-raised. On a psycopg connection, (2) and (3) are one message (``BEGIN; SELECT
fencing.claim(...); ...``, ``lockd.client.sqlfence_psycopg``: a round trip less; what differs
for the block is said there); SQLAlchemy's connections take one round trip per step. The value
of ``as`` is the verified ``lockd.tokens.Claims`` (``claims.locks``: lock -> fence claimed).

``lease``: a ``Lease``/``AsyncLease`` (or multi-lock ``MultiLease``/``AsyncMultiLease``) of
either client, or the token text itself. Keys (``jwks=``): a JWKS dict or a
``lockd.tokens.Verifier``; if omitted, ``GET {lockd}/v1/keys`` of the lease's client (or of
``lockd_url=``, required for a bare token) is kept per lockd URL for the process by the rules the
proxy keeps (``lockd.common.keycache``): fetched again when a token names a key (``kid``) the
set lacks (lockd rotated), at most once per ``KEYS_MIN_INTERVAL_S`` (1 s), and once the set is
older than ``KEYS_MAX_AGE_S`` (60 s, lockd's ``Cache-Control``), so a retired key's tokens stop
verifying within it; while lockd cannot be reached the set it has is kept. The fetch goes
through the lease's own HTTP client (its TLS settings) when it can, else through a default
``httpx`` client: for an https lockd with a private CA and a bare token, pass ``jwks=``.
One lease per transaction: for several locks use one multi-lock lease (``acquire_many``).

Transactions: the claims must sit in the transaction that commits the block's writes, so the
connection must have **no transaction open** (psycopg: ``conn.info.transaction_status`` IDLE;
SQLAlchemy: ``not conn.in_transaction()``, so commit or roll back an autobegun one first).
Otherwise ``TransactionStateError`` (``code="transaction_open"``) is raised before any SQL: a
savepoint inside someone else's transaction could be committed, or not, long after the fence
moved on. A SQLAlchemy connection in ``AUTOCOMMIT`` mode is refused the same way
(``code="autocommit"``). Savepoints *inside* the block (``conn.transaction()``,
``begin_nested()``) are fine. A database error caught inside the block leaves the transaction
aborted, which PostgreSQL would turn into a silent ROLLBACK at COMMIT: that is raised as
``TransactionStateError`` (``code="transaction_aborted"``) instead.

Errors: ``InvalidToken`` (bad signature, unknown key: before any SQL); ``ServiceUnavailable``
(``code="lockd_unreachable"``: the token's key is unknown and lockd's keys cannot be fetched;
before any SQL); ``StaleTokenError`` (SQLSTATE ``LF001`` from ``fencing.claim``: ``lock``,
``presented``, ``highest``, the lease is marked lost, nothing committed) exactly as the HTTP
client raises it; ``LockNotClaimedError`` (SQLSTATE ``LF002``: a fence trigger refused a row of
a lock this transaction did not claim, ``lock`` names it); ``SharedTokenError`` (SQLSTATE
``LF003``: a row of a lock the lease holds shared, claimed for reading only: a shared lease
never writes). Other database errors are the driver's own.

Trust model. On the HTTP path the proxy verifies the token's signature, so a writer can only
present fences lockd issued. On the SQL path the database cannot check a signature: it trusts
its writers' claims. This function verifies the token before claiming, but any role allowed to
call ``fencing.claim`` could claim any fence it likes; what keeps other writers out is the
database's grants: only roles you trust may execute ``fencing.claim`` or write the protected
tables (``resource-proxy db check`` lists the roles that can bypass the triggers).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

import httpx

import lockd.tokens as tokens
from lockd.client.claimsql import claim_function
from lockd.client.errors import (
    InvalidToken,
    LeaseLostError,
    LockClientError,
    LockNotClaimedError,
    ServiceUnavailable,
    SharedTokenError,
    StaleTokenError,
    TransactionStateError,
    body_or_raise,
    translate_transport_errors,
)
from lockd.client.lease import LeaseState
from lockd.common.fencerule import Fence, fences_of, in_lock_order
from lockd.common.keycache import AsyncKeyCache, KeyCache, KeysUnavailable

__all__ = ["fenced_transaction", "async_fenced_transaction", "claimed_transaction"]

STALE_SQLSTATE = "LF001"
NOT_CLAIMED_SQLSTATE = "LF002"
READ_ONLY_SQLSTATE = "LF003"
_PG_CLAIM = "SELECT fencing.{fn}(%s::text, %s::bigint)"
_SA_CLAIM = "SELECT fencing.{fn}(CAST(:lock AS text), CAST(:fence AS bigint))"
_INERROR = 3  # libpq PQTRANS_INERROR: a statement failed, the transaction can only roll back
_KEYS_TIMEOUT = 10.0  # seconds, for fetching lockd's JWKS with a client of our own
_STALE_DETAIL = re.compile(r"lock=(?P<lock>\S+) presented=(?P<presented>\d+) highest=(?P<highest>\d+)")
_STALE_MESSAGE = re.compile(r'stale fence (?P<presented>\d+) for lock "(?P<lock>[^"]+)": '
                            r"highest is (?P<highest>\d+)")
_LOCK_DETAIL = re.compile(r"lock=(?P<lock>\S+)")
_LOCK_MESSAGE = re.compile(r'lock "(?P<lock>[^"]+)"')
_TABLE_DETAIL = re.compile(r"table=(?P<table>\S+)")
_NO_SCHEMA, _NO_FUNCTION, _NO_PRIVILEGE = "3F000", "42883", "42501"


def _not_claimed_message(message: str, lock: str | None, table: str | None,
                         held: list[str]) -> str:
    """The database's LF002 message, then the locks on both sides and how they are bound: the
    table's lock template (installed with the policy) names the lock a row needs; a lease on
    any other name, however alike, does not let that row be written."""
    if lock is None or table is None:
        return message
    claimed = ", ".join(map(repr, held)) or "no lock"
    return (f"{message}. The row of table {table!r} needs lock {lock!r} (its lock template, "
            f"installed from the policy by resource-proxy db install, binds the row to that "
            f"name); this transaction claimed {claimed}, which the policy does not bind to "
            f"this row. Lease the row's own lock: ask the database, "
            f"SELECT fencing.lock_for('{table}', <key>), or the proxy, "
            f"FencedSession.lock_for('{table}', key); or install a policy whose template "
            f"gives your lock names")

KEYS_MIN_INTERVAL_S = 1.0
"""Least time between two fetches of one lockd's keys (seconds)."""
KEYS_MAX_AGE_S = 60.0
"""A lockd's keys are fetched again once this old (seconds; lockd's ``Cache-Control``)."""

_keys: dict[str, KeyCache] = {}
"""lockd URL -> its keys for blocking calls (shared by every call in the process)."""
_akeys: dict[str, AsyncKeyCache] = {}
"""lockd URL -> its keys for asyncio calls."""

_VERIFIED_MAX = 4096
_verified_tokens: dict[tuple[tokens.Verifier, str], tokens.Claims] = {}
"""(verifier, token) -> its claims, for keys given with ``jwks=``: a lease's token is verified
once, not on every transaction (an Ed25519 check costs about 0.1-0.5 ms here). Keyed by the
verifier object; the oldest entry goes first when full."""


def _verify(verifier: tokens.Verifier, token: str) -> tokens.Claims:
    """``verifier.verify(token)``, remembered (raises what ``verify`` raises)."""
    key = (verifier, token)
    claims = _verified_tokens.get(key)
    if claims is None:
        claims = verifier.verify(token)
        if len(_verified_tokens) >= _VERIFIED_MAX:
            del _verified_tokens[next(iter(_verified_tokens))]
        _verified_tokens[key] = claims
    return claims


# --------------------------------------------------------------------------- the token's claims


def _token_of(lease: Any) -> str:
    token = lease if isinstance(lease, str) else getattr(lease, "token", None)
    if not isinstance(token, str):
        raise TypeError(f"lease must be a lockd lease or a token string, got {lease!r}")
    return token


def _fixed_verifier(jwks: Mapping[str, Any] | tokens.Verifier | None) -> tokens.Verifier | None:
    if jwks is None or isinstance(jwks, tokens.Verifier):
        return jwks
    if isinstance(jwks, Mapping):
        return tokens.Verifier(jwks)
    raise TypeError(f"jwks must be a JWKS dict or a lockd.tokens.Verifier, got {jwks!r}")


def _lockd_of(lease: Any, lockd_url: str | None) -> tuple[str, Any]:
    """lockd's base URL and the HTTP client (with its TLS settings) of the lease's client."""
    if lockd_url is not None:
        return lockd_url.rstrip("/"), None
    client = getattr(lease, "_client", None)
    url = getattr(client, "url", None)
    if not isinstance(url, str):
        raise TypeError("a bare token needs jwks= or lockd_url= to be verified")
    return url.rstrip("/"), getattr(client, "_http", None)


def _refused(exc: Exception, where: str) -> LockClientError:
    """The client's error for a token the keys refused (``KeysUnavailable``, ``TokenError``)."""
    if isinstance(exc, KeysUnavailable):
        return ServiceUnavailable(f"token not verified before any SQL: {exc}",
                                  code="lockd_unreachable")
    return InvalidToken(f"token refused before any SQL: {exc} ({where})", code="invalid_token")


def _check(verifier: tokens.Verifier, token: str, where: str, *,
           remember: bool = True) -> tokens.Claims:
    try:
        return _verify(verifier, token) if remember else verifier.verify(token)
    except tokens.TokenError as exc:
        raise _refused(exc, where) from None


def _rules(url: str) -> dict[str, Any]:
    return {"min_interval_s": KEYS_MIN_INTERVAL_S, "max_age_s": KEYS_MAX_AGE_S,
            "source": f"{url}/v1/keys"}


def _fetch_keys(url: str, http: Any) -> Any:
    own = not isinstance(http, httpx.Client)
    client = httpx.Client(timeout=_KEYS_TIMEOUT) if own else http
    try:
        with translate_transport_errors(f"GET {url}/v1/keys"):
            response = client.get(url + "/v1/keys")
        return body_or_raise("GET", "/v1/keys", response)
    finally:
        if own:
            client.close()


async def _afetch_keys(url: str, http: Any) -> Any:
    if not isinstance(http, httpx.AsyncClient):  # a sync client's, or none: off the event loop
        return await asyncio.to_thread(_fetch_keys, url, http)
    with translate_transport_errors(f"GET {url}/v1/keys"):
        response = await http.get(url + "/v1/keys")
    return body_or_raise("GET", "/v1/keys", response)


def _refuse_known_loss(lease: Any, refuse_lost: bool) -> None:
    """``LeaseLostError`` (before any SQL) for a lease object the client knows is lost, unless
    ``refuse_lost`` is off (a bare token is not known either way)."""
    if refuse_lost and getattr(lease, "state", None) is LeaseState.LOST:
        lease.check()


def _verified(lease: Any, jwks: Any, lockd_url: str | None) -> tokens.Claims:
    token, fixed = _token_of(lease), _fixed_verifier(jwks)
    if fixed is not None:
        # a JWKS dict makes a new verifier per call: nothing worth remembering under it
        return _check(fixed, token, "keys given by jwks=", remember=fixed is jwks)
    url, http = _lockd_of(lease, lockd_url)

    def load() -> Any:
        return _fetch_keys(url, http)

    keys = _keys.get(url)
    if keys is None:
        keys = _keys.setdefault(url, KeyCache(load, **_rules(url)))
    try:
        return keys.verify(token, loader=load)
    except (tokens.TokenError, KeysUnavailable) as exc:
        raise _refused(exc, f"keys of {url}") from None


async def _averified(lease: Any, jwks: Any, lockd_url: str | None) -> tokens.Claims:
    token, fixed = _token_of(lease), _fixed_verifier(jwks)
    if fixed is not None:
        # a JWKS dict makes a new verifier per call: nothing worth remembering under it
        return _check(fixed, token, "keys given by jwks=", remember=fixed is jwks)
    url, http = _lockd_of(lease, lockd_url)

    async def load() -> Any:
        return await _afetch_keys(url, http)

    keys = _akeys.get(url)
    if keys is None:
        keys = _akeys.setdefault(url, AsyncKeyCache(load, **_rules(url)))
    try:
        return await keys.verify(token, loader=load)
    except (tokens.TokenError, KeysUnavailable) as exc:
        raise _refused(exc, f"keys of {url}") from None


def _in_lock_order(claims: tokens.Claims) -> list[Fence]:
    """A fence of every lock of ``claims``, sorted by name (the order of the claims), each for
    what the token's hold allows (``fencerule``: exclusive for writing, shared for reading)."""
    return fences_of(claims, None)


# --------------------------------------------------------------------------- the connection


def _kind(conn: Any, *, asynchronous: bool) -> str:
    """``"psycopg"`` or ``"sqlalchemy"``; ``TypeError`` for anything else or the wrong flavour.
    A module not imported yet cannot have made ``conn``, so none is imported here."""
    found: tuple[str, bool] | None = None
    pg = sys.modules.get("psycopg")
    engine, orm = sys.modules.get("sqlalchemy.engine"), sys.modules.get("sqlalchemy.orm")
    aio = sys.modules.get("sqlalchemy.ext.asyncio")
    if pg is not None and isinstance(conn, pg.AsyncConnection):
        found = ("psycopg", True)
    elif pg is not None and isinstance(conn, pg.Connection):
        found = ("psycopg", False)
    elif aio is not None and isinstance(conn, aio.AsyncConnection | aio.AsyncSession
                                        | aio.async_scoped_session):
        found = ("sqlalchemy", True)
    elif (engine is not None and isinstance(conn, engine.Connection)) or (
            orm is not None and isinstance(conn, orm.Session | orm.scoped_session)):
        found = ("sqlalchemy", False)
    if found is None:
        raise TypeError("conn must be a psycopg (3) connection or a SQLAlchemy Connection, "
                        f"Session or their async twins, got {type(conn).__name__}")
    if found[1] != asynchronous:
        other = "async_fenced_transaction" if found[1] else "fenced_transaction"
        raise TypeError(f"{type(conn).__name__} needs {other}")
    return found[0]


def _refuse_open(kind: str, conn: Any) -> None:
    if kind == "psycopg":
        status = conn.info.transaction_status
        is_open = int(status) != 0  # PQTRANS_IDLE
        what = f"its transaction status is {getattr(status, 'name', status)}"
    else:
        is_open, what = conn.in_transaction(), "it is in a transaction"
    if is_open:
        raise TransactionStateError(
            f"fenced_transaction needs a connection with no transaction open ({what}): the "
            "claims must be in the transaction that commits; commit or roll back first",
            code="transaction_open")


def _refuse_autocommit(fairy: Any) -> None:
    """``fairy``: SQLAlchemy's pooled DBAPI connection, inside ``begin()``."""
    if getattr(fairy.dbapi_connection, "autocommit", False):
        raise TransactionStateError(
            "fenced_transaction cannot use a connection in AUTOCOMMIT mode: each claim and "
            "write would commit alone", code="autocommit")


def _refuse_aborted(driver: Any) -> None:
    """Raise if ``driver``'s (psycopg 3 or psycopg2) transaction is aborted."""
    status = getattr(getattr(driver, "info", None), "transaction_status", None)
    if status is None and callable(getattr(driver, "get_transaction_status", None)):
        status = driver.get_transaction_status()
    if status is not None and int(status) == _INERROR:
        raise TransactionStateError(
            "the fenced transaction was aborted by an error caught inside the block; rolled "
            "back, nothing committed", code="transaction_aborted")


def _sa_fairy(conn: Any) -> Any:
    engine = sys.modules["sqlalchemy.engine"]
    return (conn if isinstance(conn, engine.Connection) else conn.connection()).connection


async def _asa_fairy(conn: Any) -> Any:
    aio = sys.modules["sqlalchemy.ext.asyncio"]
    if not isinstance(conn, aio.AsyncConnection):
        conn = await conn.connection()
    return await conn.get_raw_connection()


# --------------------------------------------------------------------------- database errors


def _pg_error(exc: BaseException) -> tuple[str | None, str, str]:
    """SQLSTATE, primary message and DETAIL of a PostgreSQL error raised by psycopg or psycopg2,
    or by them or asyncpg (its adapted error, then the error it was raised from) under
    SQLAlchemy. ``(None, "", "")`` for any other exception."""
    orig = getattr(exc, "orig", None)
    candidates = [exc] if orig is None else [orig, orig.__cause__]
    state, message, detail = None, "", ""
    for seen in candidates:
        code = getattr(seen, "sqlstate", None) or getattr(seen, "pgcode", None)
        if seen is None or not isinstance(code, str):
            continue
        diag = getattr(seen, "diag", None)
        state = state or code
        message = message or getattr(diag, "message_primary", None) or str(seen)
        found = getattr(diag, "message_detail", None) or getattr(seen, "detail", None)
        detail = detail or (found if isinstance(found, str) else "")
    return state, message, detail


def _not_installed(state: str | None, message: str) -> TransactionStateError | None:
    """The error naming the fix when a claim failed because the database has no (or an old,
    or a closed) ``fencing`` schema: ``None`` for any other failure."""
    if state == _NO_SCHEMA or (state == _NO_FUNCTION and "fencing." in message):
        return TransactionStateError(
            f"this database has no fence functions ({message}): install them with "
            "`resource-proxy db install --database-url postgresql://... --policy policy.yaml` "
            "(docs/sql-fencing.md), then retry; nothing was written",
            code="fencing_not_installed")
    if state == _NO_PRIVILEGE and "fencing" in message:
        return TransactionStateError(
            f"this role may not claim fences ({message}): name it at install, "
            "`resource-proxy db install --claim-role ROLE`; nothing was written",
            code="claim_not_granted")
    return None


class _Claiming:
    """Which claim is running, to turn ``LF001``/``LF002`` into the client's errors."""

    def __init__(self, lease: Any):
        self.lease = lease
        self.now: tuple[str, int] | None = None
        self.held: list[str] = []
        """The locks this transaction claimed (in claim order)."""

    def claimed_all(self, fences: Sequence[Fence]) -> Callable[[], None]:
        """For claims sent together: mark the first as running (a missing ``fencing`` schema
        is reported as such), and return the callback that records them all as made."""
        self.now = (fences[0].lock, fences[0].fence) if fences else None

        def made() -> None:
            self.now = None
            self.held.extend(f.lock for f in fences)

        return made

    def error_for(self, exc: BaseException) -> LockClientError | None:
        state, message, detail = _pg_error(exc)
        if self.now is not None and (missing := _not_installed(state, message)) is not None:
            return missing
        if state == NOT_CLAIMED_SQLSTATE:
            found = _LOCK_DETAIL.search(detail) or _LOCK_MESSAGE.search(message)
            lock = found and found["lock"]
            table = _TABLE_DETAIL.search(detail)
            return LockNotClaimedError(_not_claimed_message(message, lock, table and table["table"],
                                                            self.held),
                                       lock=lock, held=list(self.held),
                                       problem={"detail": detail, "lock": lock,
                                                "held": list(self.held)})
        if state == READ_ONLY_SQLSTATE:
            found = _LOCK_DETAIL.search(detail) or _LOCK_MESSAGE.search(message)
            return SharedTokenError(message, lock=found and found["lock"],
                                    problem={"detail": detail})
        if state != STALE_SQLSTATE:
            return None
        found = _STALE_DETAIL.search(detail) or _STALE_MESSAGE.search(message)
        lock, presented = self.now or (None, None)
        highest = None
        if found:
            lock, presented, highest = found["lock"], int(found["presented"]), int(found["highest"])
        problem = {"code": "stale_token", "detail": message, "lock": lock,
                   "presented": presented, "highest": highest}
        error = StaleTokenError(message, lock=lock, presented=presented, highest=highest,
                                problem=problem)
        mark = getattr(self.lease, "_mark_lost", None)
        if callable(mark):  # a newer grant exists: the lease is lost, as after the proxy's 409
            mark(LeaseLostError(f"lease of {lock!r} (fence {presented}) is stale in the "
                                f"database: highest fence is {highest}", lock=lock,
                                code="stale_token"))
        return error


def _raise_mapped(claiming: _Claiming, exc: Exception) -> None:
    """Raise the client's error for ``exc`` (a database error it names), else return."""
    error = claiming.error_for(exc)
    if error is not None:
        raise error from None if error.code == "fencing_not_installed" else exc


def _one_trip() -> Any:
    """``lockd.client.sqlfence_psycopg``, imported on first use (it imports psycopg)."""
    from lockd.client import sqlfence_psycopg
    return sqlfence_psycopg


# --------------------------------------------------------------------------- the two entries


@contextlib.contextmanager
def fenced_transaction(conn: Any, lease: Any, *,
                       jwks: Mapping[str, Any] | tokens.Verifier | None = None,
                       lockd_url: str | None = None,
                       refuse_lost: bool = True) -> Iterator[tokens.Claims]:
    """Verify ``lease``'s token, open a transaction on ``conn``, claim every fence of the token,
    run the block, commit; roll back and re-raise on any error. See the module docstring for
    the accepted ``conn``/``lease``, the keys (``jwks``, ``lockd_url``) and the errors.
    ``refuse_lost`` (default on): a lease the client knows is lost raises
    ``LeaseLostError`` before any SQL; ``False`` leaves the decision to the fence alone."""
    _refuse_known_loss(lease, refuse_lost)
    claims = _verified(lease, jwks, lockd_url)  # before any SQL
    with claimed_transaction(conn, _in_lock_order(claims), lease):
        yield claims


@contextlib.contextmanager
def claimed_transaction(conn: Any, fences: Sequence[Fence], lease: Any = None) -> Iterator[None]:
    """Steps (2) to (5) of ``fenced_transaction`` for ``fences`` already verified (each claimed
    for its purpose, in lock order): open a transaction on ``conn``, claim, run the block,
    commit. ``lease``, if given, is marked lost on a stale claim. The errors are
    ``fenced_transaction``'s after the verification. ``lockd.guard`` claims through this."""
    kind = _kind(conn, asynchronous=False)
    _refuse_open(kind, conn)
    claiming = _Claiming(lease)
    if kind == "psycopg" and _one_trip().applies(conn):
        ordered = in_lock_order(fences)
        try:
            with _one_trip().transaction(conn, ordered, claiming.claimed_all(ordered)):
                yield
        except Exception as exc:
            _raise_mapped(claiming, exc)
            raise
        return
    try:
        with conn.transaction() if kind == "psycopg" else conn.begin():
            driver = conn
            if kind == "sqlalchemy":
                fairy = _sa_fairy(conn)
                _refuse_autocommit(fairy)
                driver = fairy.driver_connection
            for fence in in_lock_order(fences):
                claiming.now = (fence.lock, fence.fence)
                _claim(kind, conn, fence)
                claiming.held.append(fence.lock)
            claiming.now = None
            yield
            _refuse_aborted(driver)
    except Exception as exc:
        error = claiming.error_for(exc)
        if error is None:
            raise
        raise error from None if error.code == "fencing_not_installed" else exc


@contextlib.asynccontextmanager
async def async_fenced_transaction(conn: Any, lease: Any, *,
                                   jwks: Mapping[str, Any] | tokens.Verifier | None = None,
                                   lockd_url: str | None = None,
                                   refuse_lost: bool = True) -> AsyncIterator[tokens.Claims]:
    """The asyncio twin of ``fenced_transaction`` (psycopg ``AsyncConnection``, SQLAlchemy
    ``AsyncConnection``/``AsyncSession``); a JWKS fetch runs on the event loop."""
    _refuse_known_loss(lease, refuse_lost)
    claims = await _averified(lease, jwks, lockd_url)  # before any SQL
    kind = _kind(conn, asynchronous=True)
    _refuse_open(kind, conn)
    claiming = _Claiming(lease)
    if kind == "psycopg" and _one_trip().applies(conn):
        ordered = _in_lock_order(claims)
        try:
            async with _one_trip().async_transaction(conn, ordered,
                                                     claiming.claimed_all(ordered)):
                yield claims
        except Exception as exc:
            _raise_mapped(claiming, exc)
            raise
        return
    try:
        async with conn.transaction() if kind == "psycopg" else conn.begin():
            driver = conn
            if kind == "sqlalchemy":
                fairy = await _asa_fairy(conn)
                _refuse_autocommit(fairy)
                driver = fairy.driver_connection
            for fence in _in_lock_order(claims):
                claiming.now = (fence.lock, fence.fence)
                await _aclaim(kind, conn, fence)
                claiming.held.append(fence.lock)
            claiming.now = None
            yield claims
            _refuse_aborted(driver)
    except Exception as exc:
        error = claiming.error_for(exc)
        if error is None:
            raise
        raise error from None if error.code == "fencing_not_installed" else exc


def _claim_sql(kind: str, fence: Fence) -> tuple[Any, Any]:
    """The statement claiming ``fence`` for its purpose, and its parameters."""
    fn = claim_function(fence)
    if kind == "psycopg":
        return _PG_CLAIM.format(fn=fn), (fence.lock, fence.fence)
    return (sys.modules["sqlalchemy"].text(_SA_CLAIM.format(fn=fn)),
            {"lock": fence.lock, "fence": fence.fence})


def _claim(kind: str, conn: Any, fence: Fence) -> None:
    conn.execute(*_claim_sql(kind, fence))


async def _aclaim(kind: str, conn: Any, fence: Fence) -> None:
    await conn.execute(*_claim_sql(kind, fence))
