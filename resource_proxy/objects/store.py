"""The objects' pointer rows, in the proxy's own database, moved in the fence's transaction.

One row per object: ``(bucket, key)`` -> ``version`` (1, 2, ... per object), ``blob`` (the
generated name of its body), ``size``, ``sha256``, ``content_type``, ``lock`` and ``fence``
(of the write that made it), ``modified_ms`` (the proxy's clock, unix ms) and ``body``: NULL,
or the body itself when it is small enough to be kept inline (``--objects-inline-max``; its
``blob`` is then a generated name all the same, the ETag's, that no blob store holds). PostgreSQL:
``resource_proxy.objects`` (next to the Idempotency-Key records); SQLite:
``resource_proxy_objects``. Created at start if missing.

A write is ONE transaction of the row store (``store.fenced``: the tables' fence check, the same
``fencing.try_claim`` / fence upsert on the same fence table, through ``fencing.check_all``):
fence raised and checked, the object's row read (locked: ``FOR UPDATE``; SQLite holds the
database's write lock), the caller's preconditions judged on it, the row inserted, replaced or
deleted, the Idempotency-Key record written, COMMIT. A stale fence or a failed precondition
rolls it back whole, so the pointer never names a blob written under a superseded fence. On
PostgreSQL a PUT's locked read and upsert are ONE statement (a CTE returning the previous row
beside the new version; the preconditions are judged on that row before COMMIT), and BEGIN
goes with the fence claim (``PostgresStore.fenced``): BEGIN + claim, the statement, COMMIT --
three round trips. A PUT whose body is inline and that has no precondition (nor
Idempotency-Key) has nothing left to judge once the fence passed, so the claim and its statement
go as ONE simple query, one transaction (``PostgresStore.claimed_statement``: the database's
write claim, which refuses a stale fence by aborting it, then ``EXECUTE`` of the move the session
prepared once): one round trip.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from psycopg.pq import Escaping

from lockd.common.fencerule import Fence
from resource_proxy.errors import NotFound, PreconditionFailed
from resource_proxy.fencing import PG_SCHEMA
from resource_proxy.idempotency import Once, Reply
from resource_proxy.objects.blobs import Stored

__all__ = ["Pointer", "Preconditions", "Pointers", "SQLITE_TABLE", "PG_TABLE"]

SQLITE_TABLE = "resource_proxy_objects"
PG_TABLE = f'"{PG_SCHEMA}".objects'
_COLUMNS = ("bucket, key, version, blob, size, sha256, content_type, lock, fence, modified_ms, "
            "body")
_LISTED = _COLUMNS.replace(", body", ", NULL")  # a listing never carries bodies
_ADVISORY_KEY = 0x5250_4F42_4A53  # "RPOBJS": concurrent first starts create the table once
# PostgreSQL: the move's parameters, in order, with their types (``Pointers._moved``)
_MOVED = {"bucket": "text", "key": "text", "blob": "text", "size": "bigint", "sha256": "text",
          "content_type": "text", "lock": "text", "fence": "bigint", "modified_ms": "bigint",
          "body": "bytea"}
_MOVE_NAME = "resource_proxy_object_move"


def _ddl(table: str, binary: str) -> str:
    return (f"CREATE TABLE IF NOT EXISTS {table} (bucket text NOT NULL, key text NOT NULL, "
            "version bigint NOT NULL, blob text NOT NULL UNIQUE, size bigint NOT NULL, "
            "sha256 text NOT NULL, content_type text NOT NULL, lock text NOT NULL, "
            f"fence bigint NOT NULL, modified_ms bigint NOT NULL, body {binary}, "
            "PRIMARY KEY (bucket, key))")


@dataclass(frozen=True, slots=True)
class Pointer:
    """An object's current version; ``body`` is its bytes when kept inline (None: in the blob
    store under ``blob``; also None in a listing)."""

    bucket: str
    key: str
    version: int
    blob: str
    size: int
    sha256: str
    content_type: str
    lock: str
    fence: int
    modified_ms: int
    body: bytes | None = None

    @property
    def stored_blob(self) -> str | None:
        """The blob store's name of the body (None: the body is inline, no blob to delete)."""
        return self.blob if self.body is None else None

    @property
    def etag(self) -> str:
        """The strong ETag: the blob's name, unique per write (quoted)."""
        return f'"{self.blob}"'

    def json(self) -> dict[str, Any]:
        modified = datetime.fromtimestamp(self.modified_ms / 1000, UTC)
        return {"bucket": self.bucket, "key": self.key, "version": self.version,
                "etag": self.etag, "size": self.size, "sha256": self.sha256,
                "content_type": self.content_type, "lock": self.lock, "fence": self.fence,
                "modified": modified.isoformat().replace("+00:00", "Z")}


@dataclass(frozen=True, slots=True)
class Preconditions:
    """``If-Match`` (ETags, or ``*``: the object must exist) and ``If-None-Match: *`` (it must
    not) of a write; judged inside the transaction (412 ``precondition_failed``)."""

    if_match: tuple[str, ...] | None = None
    if_none_match: bool = False

    @property
    def none(self) -> bool:
        """No precondition: ``judge`` passes whatever the current row."""
        return self.if_match is None and not self.if_none_match

    def judge(self, current: Pointer | None) -> None:
        etag = current.etag if current is not None else None
        if self.if_none_match and current is not None:
            raise PreconditionFailed("If-None-Match: * and the object exists", etag=etag)
        if self.if_match is not None:
            if current is None:
                raise PreconditionFailed("If-Match and the object does not exist", etag=None)
            if "*" not in self.if_match and current.etag not in self.if_match:
                raise PreconditionFailed(f"If-Match: the object's ETag is {current.etag}",
                                         etag=etag)


async def _done() -> None:
    return None


def _pointer(row: Sequence[Any] | None) -> Pointer | None:
    return None if row is None else Pointer(*row)


class Pointers:
    """The pointer rows on the row store ``store`` (``PostgresStore`` or ``SqliteStore``: their
    ``fenced``/``plain`` calls run these statements in their transactions and connections)."""

    def __init__(self, store: Any, postgres: bool):
        self.store = store
        self.pg = postgres
        table = PG_TABLE if postgres else SQLITE_TABLE
        p = (lambda n: f"%({n})s") if postgres else (lambda n: f":{n}")
        where = f"bucket = {p('bucket')} AND key = {p('key')}"
        self._select = f"SELECT {_COLUMNS} FROM {table} WHERE {where}"
        self._lock = self._select + (" FOR UPDATE" if postgres else "")
        names = [c.strip() for c in _COLUMNS.split(",")]
        self._upsert = (f"INSERT INTO {table} ({_COLUMNS}) VALUES "
                        f"({', '.join(p(n) for n in names)}) ON CONFLICT (bucket, key) DO UPDATE "
                        "SET " + ", ".join(f"{n} = excluded.{n}" for n in names[2:]))
        # PostgreSQL: the locked read and the upsert in ONE statement (one round trip), the
        # previous row returned beside the new version (NULLs: there was none). Its snapshot is
        # taken after the fence claim's statement, as the separate read's was; FOR UPDATE
        # follows a row updated since to its latest version, as the separate read did.
        upsert = self._upsert.replace(p("version"), "COALESCE((SELECT version FROM old), 0) + 1")
        self._move = (f"WITH old AS ({self._lock}), new AS ({upsert} RETURNING version) SELECT "
                      + ", ".join(f"old.{n}" for n in names[:-1])
                      # an inline body is not sent back: b"" says it was inline (no blob)
                      + ", CASE WHEN old.body IS NULL THEN NULL ELSE ''::bytea END, "
                      "new.version FROM new LEFT JOIN old ON true")
        # the same statement prepared with SQL PREPARE (parameters $1..., in _MOVED order), for
        # the inline PUT without preconditions whose move carries the COMMIT (``_moved``)
        positional = self._move
        for index, name in enumerate(_MOVED, 1):
            positional = positional.replace(p(name), f"${index}")
        self._prepared_move = f"({', '.join(_MOVED.values())}) AS {positional}"
        self._delete = f"DELETE FROM {table} WHERE {where}"
        order = 'key COLLATE "C"' if postgres else "key"
        prefix = (f"left(key, {p('n')}) = {p('prefix')}" if postgres
                  else f"substr(key, 1, {p('n')}) = {p('prefix')}")
        self._list = (f"SELECT {_LISTED} FROM {table} WHERE bucket = {p('bucket')} AND "
                      f"{order} > {p('after')} AND {prefix} ORDER BY {order} LIMIT {p('limit')}")
        self._referenced = (f"SELECT blob FROM {table} WHERE blob = ANY(%(names)s)" if postgres
                            else f"SELECT blob FROM {table} WHERE blob IN (SELECT value FROM "
                                 "json_each(:names))")
        self._ddl = _ddl(table, "bytea" if postgres else "blob")
        # a table made before bodies were kept inline gains the column (NULL: blob-backed)
        self._add_body = (f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS body bytea" if postgres
                          else f"ALTER TABLE {table} ADD COLUMN body blob")
        self._table = table

    async def create(self) -> None:
        """The pointer table, if missing (safe when several proxies start at once)."""
        if self.pg:
            async def create(conn) -> None:
                async with conn.transaction():
                    await conn.execute("SELECT pg_advisory_xact_lock(%(k)s)", {"k": _ADVISORY_KEY})
                    await conn.execute(self._ddl)
                    await conn.execute(self._add_body)

            await self.store.plain(create)
        else:
            def create_sqlite(conn) -> None:  # type: ignore[misc]
                conn.execute(self._ddl)
                columns = {r[1] for r in conn.execute(f"PRAGMA table_info({self._table})")}
                if "body" not in columns:
                    conn.execute(self._add_body)

            await self.store.plain(create_sqlite)

    # -- one statement each, on the caller's connection -------------------------------------

    async def _run(self, conn: Any, sql: str, params: dict[str, Any], rows: str = "one") -> Any:
        if self.pg:
            cur = await conn.execute(sql, params)
            return await (cur.fetchone() if rows == "one" else cur.fetchall())
        cur = conn.execute(sql, params)
        return cur.fetchone() if rows == "one" else cur.fetchall()

    def _literals(self, params: dict[str, Any]) -> Callable[[Any], str | None]:
        """The move's parameters (``_MOVED`` order) as SQL literals quoted for a connection;
        None for a text value PostgreSQL refuses (a NUL): then the move goes as a parameter,
        and is refused as any such value is."""

        def literals(conn: Any) -> str | None:
            escape = Escaping(conn.pgconn).escape_literal
            values = []
            for name, kind in _MOVED.items():
                value = params[name]
                if kind == "text":
                    if "\x00" in value:
                        return None
                    values.append(escape(value.encode()).decode())
                elif kind == "bigint":
                    values.append(str(int(value)))
                else:
                    values.append(f"decode('{value.hex()}', 'hex')")
            return ", ".join(values)

        return literals

    # -- calls ------------------------------------------------------------------------------

    async def put(self, fence: Fence, bucket: str, key: str, stored: Stored, content_type: str,
                  conditions: Preconditions, once: Once | None, replaced: list[str],
                  durable: Callable[[], Awaitable[None]] = _done,
                  inline: bytes | None = None) -> tuple[bool, Pointer] | Reply:
        """Move the object's pointer to ``stored`` in the fence's transaction: (created, the
        new pointer), or with ``once`` the ``Reply``; ``inline``: the bytes themselves, kept in
        the row (inline: no blob, so nothing to make durable but this transaction). The
        replaced version's blob name, if it had one, is appended to ``replaced`` (the caller
        deletes it once this committed). ``durable()``
        returns once the blob is durable: awaited before COMMIT (PostgreSQL: after the
        transaction's statements, which so overlap the disk's work; SQLite, whose transaction
        runs in one worker-thread call: before it)."""

        def row(current: Pointer | None) -> tuple[Pointer, dict[str, Any]]:
            conditions.judge(current)
            new = Pointer(bucket, key, (current.version + 1) if current else 1, stored.name,
                          stored.size, stored.sha256, content_type, fence.lock, fence.fence,
                          int(time.time() * 1000), inline)
            if current is not None and current.stored_blob is not None:
                replaced.append(current.stored_blob)
            return new, {n: getattr(new, n) for n in Pointer.__slots__}

        where = {"bucket": bucket, "key": key}
        if self.pg:
            params = {"bucket": bucket, "key": key, "blob": stored.name, "size": stored.size,
                      "sha256": stored.sha256, "content_type": content_type, "lock": fence.lock,
                      "fence": fence.fence, "modified_ms": int(time.time() * 1000),
                      "body": inline}

            def moved(found: Sequence[Any]) -> tuple[bool, Pointer]:
                current = None if found[0] is None else Pointer(*found[:-1])
                conditions.judge(current)
                new = Pointer(bucket, key, found[-1], stored.name, stored.size, stored.sha256,
                              content_type, fence.lock, fence.fence, params["modified_ms"],
                              inline)
                if current is not None and current.stored_blob is not None:
                    replaced.append(current.stored_blob)
                return current is None, new

            if inline is not None and conditions.none and once is None:
                # nothing to make durable first, nothing to judge on the previous row: the
                # claim and the move in one round trip, one transaction
                await durable()  # an inline body's: nothing to wait for
                found = await self.store.claimed_statement(
                    fence, _MOVE_NAME, self._prepared_move, self._literals(params))
                if found is not None:
                    return moved(found)

            async def body(conn) -> tuple[bool, Pointer]:
                # the row moved first, judged after, in the same transaction: a failed
                # precondition raises, and the transaction rolls back whole
                result = moved(await self._run(conn, self._move, params))
                await durable()  # the body before the pointer: COMMIT follows
                return result
        else:
            await durable()

            def body(conn) -> tuple[bool, Pointer]:  # type: ignore[misc]
                current = _pointer(conn.execute(self._lock, where).fetchone())
                new, params = row(current)
                conn.execute(self._upsert, params)
                return current is None, new
        return await self.store.fenced([fence], body, once)

    async def delete(self, fence: Fence, bucket: str, key: str, conditions: Preconditions,
                     once: Once | None, replaced: list[str]) -> Pointer | Reply:
        """Remove the object's pointer in the fence's transaction (404 if absent: rolled back,
        the fence not raised); its blob name appended to ``replaced``."""

        def judge(current: Pointer | None) -> Pointer:
            if current is None:
                raise NotFound(f"no object {key!r} in bucket {bucket!r}", bucket=bucket)
            conditions.judge(current)
            if current.stored_blob is not None:
                replaced.append(current.stored_blob)
            return current

        where = {"bucket": bucket, "key": key}
        if self.pg:
            async def body(conn) -> Pointer:
                current = judge(_pointer(await self._run(conn, self._lock, where)))
                await conn.execute(self._delete, where)
                return current
        else:
            def body(conn) -> Pointer:  # type: ignore[misc]
                current = judge(_pointer(conn.execute(self._lock, where).fetchone()))
                conn.execute(self._delete, where)
                return current
        return await self.store.fenced([fence], body, once)

    async def get(self, bucket: str, key: str, fence: Fence | None) -> Pointer | None:
        """The object's pointer (None if absent); with ``fence``, a fenced read: the fence
        claimed (for its purpose) in the transaction that reads it."""
        where = {"bucket": bucket, "key": key}
        if self.pg:
            async def body(conn) -> Pointer | None:
                return _pointer(await self._run(conn, self._select, where))
        else:
            def body(conn) -> Pointer | None:  # type: ignore[misc]
                return _pointer(conn.execute(self._select, where).fetchone())
        if fence is None:
            return await self.store.plain(body)
        return await self.store.fenced([fence], body)

    async def list(self, bucket: str, prefix: str, after: str, limit: int) -> list[Pointer]:
        params = {"bucket": bucket, "prefix": prefix, "n": len(prefix), "after": after,
                  "limit": limit}
        if self.pg:
            async def body(conn) -> list[Pointer]:
                return [Pointer(*r) for r in await self._run(conn, self._list, params, "all")]
        else:
            def body(conn) -> list[Pointer]:  # type: ignore[misc]
                return [Pointer(*r) for r in conn.execute(self._list, params).fetchall()]
        return await self.store.plain(body)

    async def referenced(self, names: Sequence[str]) -> set[str]:
        """Which of the blob ``names`` some pointer names."""
        if not names:
            return set()
        if self.pg:
            params: dict[str, Any] = {"names": list(names)}

            async def body(conn) -> set[str]:
                return {r[0] for r in await self._run(conn, self._referenced, params, "all")}
        else:
            params = {"names": json.dumps(list(names))}

            def body(conn) -> set[str]:  # type: ignore[misc]
                return {r[0] for r in conn.execute(self._referenced, params).fetchall()}
        return await self.store.plain(body)
