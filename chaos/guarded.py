"""The counter workload's tables served by a service guarded with ``lockd.guard`` instead of the
resource proxy: the same HTTP routes the workers use (``FencedSession``: claim, fenced reads,
batch, PATCH/PUT/POST/DELETE of ``counter`` and ``marks``), each checked by ``FenceGuard`` and
claimed in the write's own PostgreSQL transaction by ``PostgresFences`` (``fencing.claim``). The
workers, the database's history triggers and the checker are unchanged: ``--via guard`` of a
chaos run (``chaos.services``) points the workers here, so a bug in the guard's claim is judged
like one in the proxy's.

    python -m chaos.guarded --lockd URL --db postgresql://... --lock chaos/counter --port P

Both tables are written under the one lock ``--lock`` (the proxy's policy binds them so). A
database error answers 503 ``database_unavailable`` (the worker logs the outcome unknown; the
database's history decides). A mark inserted again with the same row (a retried write whose
first attempt committed) is answered as written, as the proxy's Idempotency-Key replay would.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

import psycopg
import uvicorn
from fastapi import FastAPI, Request
from psycopg import sql
from psycopg_pool import ConnectionPool

from lockd.common.fencerule import READ, WRITE
from lockd.common.problems import ProblemError
from lockd.common.responses import error_response
from lockd.guard import HEADER, FenceGuard, PostgresFences
from lockd.guard.web import add_problem_handlers

__all__ = ["create_app", "main"]

COLUMNS = {"counter": ("id", "value", "op", "worker", "fence", "read_value"),
           "marks": ("id", "worker", "fence")}


class Problem(ProblemError):
    def __init__(self, status: int, code: str, detail: str):
        super().__init__(detail)
        self.status, self.code, self.title = status, code, code.replace("_", " ")  # type: ignore[misc]


def _key(table: str, key: str) -> Any:
    return int(key) if table == "counter" else key


def _row(table: str, row: Any, *, partial: bool = False) -> dict[str, Any]:
    if table not in COLUMNS:
        raise Problem(404, "not_found", f"no table {table!r}")
    if not isinstance(row, Mapping) or not row or any(c not in COLUMNS[table] for c in row):
        raise Problem(422, "invalid_request", f"bad row for {table}: {row!r}")
    return dict(row)


class Tables:
    """The statements on ``counter`` and ``marks``, inside a transaction the caller opened."""

    def __init__(self, conn: psycopg.Connection):
        self.conn = conn

    def get(self, table: str, key: Any) -> dict[str, Any] | None:
        cols = COLUMNS[table]
        cur = self.conn.execute(sql.SQL("SELECT {} FROM {} WHERE id = %s").format(
            sql.SQL(", ").join(map(sql.Identifier, cols)), sql.Identifier(table)), (key,))
        found = cur.fetchone()
        return dict(zip(cols, found, strict=True)) if found else None

    def update(self, table: str, key: Any, row: dict[str, Any]) -> dict[str, Any]:
        sets = sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in row)
        cur = self.conn.execute(sql.SQL("UPDATE {} SET {} WHERE id = %s").format(
            sql.Identifier(table), sets), (*row.values(), key))
        if cur.rowcount == 0:
            raise Problem(404, "not_found", f"no row {key!r} in {table}")
        return {"id": key, **row}

    def upsert(self, table: str, key: Any, row: dict[str, Any]) -> dict[str, Any]:
        row = {**row, "id": key}
        cols = list(row)
        self.conn.execute(sql.SQL(
            "INSERT INTO {t} ({c}) VALUES ({v}) ON CONFLICT (id) DO UPDATE SET {s}").format(
            t=sql.Identifier(table), c=sql.SQL(", ").join(map(sql.Identifier, cols)),
            v=sql.SQL(", ").join(sql.Placeholder() * len(cols)),
            s=sql.SQL(", ").join(sql.SQL("{0} = excluded.{0}").format(sql.Identifier(c))
                                 for c in cols if c != "id")), list(row.values()))
        return row

    def insert(self, table: str, row: dict[str, Any]) -> dict[str, Any]:
        cols = list(row)
        cur = self.conn.execute(sql.SQL(
            "INSERT INTO {t} ({c}) VALUES ({v}) ON CONFLICT (id) DO NOTHING").format(
            t=sql.Identifier(table), c=sql.SQL(", ").join(map(sql.Identifier, cols)),
            v=sql.SQL(", ").join(sql.Placeholder() * len(cols))), list(row.values()))
        if cur.rowcount == 0:
            existing = self.get(table, row.get("id"))
            if existing is None or any(existing.get(c) != v for c, v in row.items()):
                raise Problem(409, "conflict", f"row {row.get('id')!r} of {table} exists")
        return row

    def delete(self, table: str, key: Any) -> None:
        cur = self.conn.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(
            sql.Identifier(table)), (key,))
        if cur.rowcount == 0:
            raise Problem(404, "not_found", f"no row {key!r} in {table}")


def create_app(lockd_url: str, db: str, lock: str) -> FastAPI:
    guard, fences = FenceGuard(lockd_url), PostgresFences()
    pool = ConnectionPool(db, min_size=2, max_size=16, open=True, timeout=5,
                          kwargs={"autocommit": True, "connect_timeout": 5},
                          check=ConnectionPool.check_connection)
    app = FastAPI(title="chaos counter, guarded")
    add_problem_handlers(app)

    @app.exception_handler(Problem)
    async def problem(request: Request, exc: Exception) -> Any:
        assert isinstance(exc, Problem)
        return error_response(exc)

    @app.exception_handler(psycopg.Error)
    async def database(request: Request, exc: Exception) -> Any:
        return error_response(Problem(503, "database_unavailable", str(exc)[:200]))

    def fenced(request: Request, purpose: Any, work: Any) -> Any:
        fence = guard.check(request.headers.get(HEADER), lock, purpose=purpose)
        with pool.connection() as conn, fences.transaction(conn, fence):
            return work(Tables(conn))

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/fences/{name:path}/claim")
    def claim(name: str, request: Request) -> dict[str, Any]:
        fence = guard.check(request.headers.get(HEADER), name, purpose=READ)
        if name != lock:
            raise Problem(403, "lock_not_allowed", f"lock {name!r} governs nothing here")
        with pool.connection() as conn, fences.transaction(conn, fence):
            pass
        return {"lock": lock, "highest": fence.fence}

    @app.get("/v1/tables/{table}/rows/{key}")
    def get(table: str, key: str, request: Request) -> dict[str, Any]:
        _row(table, {"id": key})
        if request.headers.get(HEADER):
            found = fenced(request, READ, lambda t: t.get(table, _key(table, key)))
        else:
            with pool.connection() as conn:
                found = Tables(conn).get(table, _key(table, key))
        if found is None:
            raise Problem(404, "not_found", f"no row {key!r} in {table}")
        return found

    @app.patch("/v1/tables/{table}/rows/{key}")
    async def patch(table: str, key: str, request: Request) -> dict[str, Any]:
        row = _row(table, await request.json())
        return await _run(fenced, request, WRITE, lambda t: t.update(table, _key(table, key), row))

    @app.put("/v1/tables/{table}/rows/{key}")
    async def put(table: str, key: str, request: Request) -> dict[str, Any]:
        row = _row(table, await request.json())
        return await _run(fenced, request, WRITE, lambda t: t.upsert(table, _key(table, key), row))

    @app.post("/v1/tables/{table}/rows", status_code=201)
    async def post(table: str, request: Request) -> dict[str, Any]:
        row = _row(table, await request.json())
        return await _run(fenced, request, WRITE, lambda t: t.insert(table, row))

    @app.delete("/v1/tables/{table}/rows/{key}", status_code=204)
    def delete(table: str, key: str, request: Request) -> None:
        _row(table, {"id": key})
        fenced(request, WRITE, lambda t: t.delete(table, _key(table, key)))

    @app.post("/v1/batch")
    async def batch(request: Request) -> dict[str, Any]:
        body = await request.json()
        ops = body.get("ops") if isinstance(body, Mapping) else None
        if not isinstance(ops, list) or not ops:
            raise Problem(422, "invalid_request", "a batch is {ops: [...]}")

        def work(t: Tables) -> dict[str, Any]:
            results = []
            for op in ops:
                table, kind = op.get("table"), op.get("op")
                row = _row(table, op.get("row") or {"id": op.get("key")})
                key = _key(table, op["key"]) if op.get("key") is not None else row.get("id")
                if kind == "update":
                    results.append(t.update(table, key, row))
                elif kind == "upsert":
                    results.append(t.upsert(table, key, row))
                elif kind == "insert":
                    results.append(t.insert(table, row))
                elif kind == "delete":
                    t.delete(table, key)
                    results.append({"id": key})
                else:
                    raise Problem(422, "invalid_request", f"unknown op {kind!r}")
            return {"results": results}

        return await _run(fenced, request, WRITE, work)

    return app


async def _run(fn: Any, *args: Any) -> Any:
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(fn, *args)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m chaos.guarded", description=__doc__.splitlines()[0])
    p.add_argument("--lockd", required=True)
    p.add_argument("--db", required=True, help="the protected PostgreSQL database (libpq URL)")
    p.add_argument("--lock", required=True)
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args(argv)
    uvicorn.run(create_app(args.lockd, args.db, args.lock), host="127.0.0.1", port=args.port,
                log_level="warning")


if __name__ == "__main__":
    main()
