"""The counter workload's tables kept in Redis by a service that writes ONLY through the guard's
Redis functions (``lockd.guard.redis``): every write of ``counter`` and ``marks`` is ONE
``lockd_fenced_xadd`` call that checks and raises the lock's fence and appends the write to a
history stream, atomically. The stream is the data: the counter is its latest counter entry, a
mark exists while its latest entry inserted it. ``--via redis-guard`` of a chaos run
(``chaos.services``) points the workers here; at the end ``RedisHistory.final_state`` turns the
stream into the ``HistoryRow`` list the unchanged checker judges (stream order = commit order),
so a stale write the functions let through shows as a violation.

    python -m chaos.redisguarded --lockd URL --redis redis://127.0.0.1:6379/0 \\
        --prefix chaos:RUN: --lock chaos/counter --port P

The machine's Redis is shared: the library is loaded under a name of the run's own
(``run_library``: the guard's library text, its names suffixed), so a run (a mutant's too)
neither replaces nor depends on the ``lockd_guard`` other users loaded; ``RedisHistory.drop``
deletes the run's keys and its library. Entries' fields: ``c_op c_worker c_fence c_read
c_value`` (a counter write), ``m_id m_worker m_fence`` (a mark inserted), ``d_id`` (a mark
deleted), ``f_high`` (the highest the call left: a ``fence`` row, as the database logs its
fence table's changes); a batch is one entry holding its parts. A fenced read (a GET with the token, or
``POST /v1/fences/{lock}/claim``) claims with ``lockd_fence_claim`` first, then reads.
A Redis error answers 503 ``redis_unavailable`` (the worker logs the outcome unknown).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from typing import Any

import redis
import uvicorn
from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool

from chaos.checker import HistoryRow
from lockd.common.fencerule import READ, WRITE, Fence
from lockd.common.problems import ProblemError
from lockd.common.responses import error_response
from lockd.guard import HEADER, FenceGuard
from lockd.guard.redis import LIBRARY, LIBRARY_NAME, RedisFences
from lockd.guard.web import add_problem_handlers

__all__ = ["RedisHistory", "RunFences", "create_app", "main", "run_library"]

COLUMNS = {"counter": ("id", "value", "op", "worker", "fence", "read_value"),
           "marks": ("id", "worker", "fence")}
_PAGE = 200


def run_library(tag: str) -> tuple[str, str]:
    """The guard's library renamed for one run: (its name, its text). ``tag``: letters, digits,
    underscores. Each function ``lockd_X`` becomes ``lockd_X_<tag>``."""
    if not re.fullmatch(r"\w+", tag):
        raise ValueError(f"bad tag {tag!r}")
    name = f"{LIBRARY_NAME}_{tag}"
    text = LIBRARY.replace(f"#!lua name={LIBRARY_NAME}", f"#!lua name={name}", 1)
    text = re.sub(r"register_function\('(lockd_\w+)'", rf"register_function('\1_{tag}'", text)
    return name, text


class RunFences(RedisFences):
    """``RedisFences`` calling the run's renamed functions (``run_library``)."""

    def __init__(self, client: Any, prefix: str, tag: str):
        super().__init__(client, prefix=prefix + "fence:")
        self.tag = tag

    def _call(self, function: str, fence: Fence, key: str | None, ttl_ms: int | None,
              *args: Any) -> Any:
        return super()._call(f"{function}_{self.tag}", fence, key, ttl_ms, *args)


class Problem(ProblemError):
    def __init__(self, status: int, code: str, detail: str):
        super().__init__(detail)
        self.status, self.code, self.title = status, code, code.replace("_", " ")  # type: ignore[misc]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisHistory:
    """The run's stream (``prefix + "history"``) read back: current state and final history."""

    def __init__(self, client: Any, prefix: str):
        self.client, self.prefix = client, prefix
        self.stream = prefix + "history"

    def entries(self) -> list[tuple[str, dict[str, str]]]:
        """Every entry, oldest first: (id, fields)."""
        out: list[tuple[str, dict[str, str]]] = []
        start = "-"
        while True:
            page = self.client.xrange(self.stream, min=start, count=_PAGE)
            out += [(_text(i), {_text(k): _text(v) for k, v in f.items()}) for i, f in page]
            if len(page) < _PAGE:
                return out
            start = "(" + _text(page[-1][0])

    def counter(self) -> dict[str, Any]:
        """The counter row: its latest counter entry (value 0 and nothing else before any)."""
        end = "+"
        while True:
            page = self.client.xrevrange(self.stream, max=end, count=_PAGE)
            for _i, f in page:
                f = {_text(k): _text(v) for k, v in f.items()}
                if "c_op" in f:
                    return {"id": 1, "value": int(f["c_value"]), "op": f["c_op"],
                            "worker": f["c_worker"], "fence": int(f["c_fence"]),
                            "read_value": int(f["c_read"])}
            if len(page) < _PAGE:
                return {"id": 1, "value": 0, "op": None, "worker": None, "fence": None,
                        "read_value": None}
            end = "(" + _text(page[-1][0])

    def marks(self) -> dict[str, dict[str, Any]]:
        """The marks present now: id -> row."""
        present: dict[str, dict[str, Any]] = {}
        for _i, f in self.entries():
            if "m_id" in f:
                present[f["m_id"]] = {"id": f["m_id"], "worker": f["m_worker"],
                                      "fence": int(f["m_fence"])}
            if "d_id" in f:
                present.pop(f["d_id"], None)
        return present

    def final_state(self) -> tuple[int, list[HistoryRow]]:
        """The counter's value and the history rows ``chaos.db`` would have logged, in stream
        (commit) order: ``counter``, ``mark_ins``, ``mark_del``."""
        rows: list[HistoryRow] = []
        for seq, (_i, f) in enumerate(self.entries(), start=1):
            if "c_op" in f:
                rows.append(HistoryRow(len(rows) + 1, f["c_op"], f["c_worker"], int(f["c_fence"]),
                                       int(f["c_read"]), int(f["c_value"]), seq=seq))
            if "m_id" in f:
                rows.append(HistoryRow(len(rows) + 1, f["m_id"], f["m_worker"], int(f["m_fence"]),
                                       0, 0, kind="mark_ins", seq=seq))
            if "d_id" in f:
                rows.append(HistoryRow(len(rows) + 1, f["d_id"], "", 0, 0, 0, kind="mark_del",
                                       seq=seq))
            if "f_high" in f:  # after the entry's own writes: they were checked before it
                rows.append(HistoryRow(len(rows) + 1, "", "", int(f["f_high"]), 0, 0,
                                       kind="fence", seq=seq))
        return int(self.counter()["value"]), rows

    def drop(self, library: str | None = None) -> None:
        """Delete the run's keys (and its function ``library``, if named)."""
        keys = list(self.client.scan_iter(match=self.prefix + "*", count=1000))
        if keys:
            self.client.delete(*keys)
        if library is not None:
            try:
                self.client.function_delete(library)
            except redis.ResponseError:  # not loaded
                pass


def _row(table: str, row: Any) -> dict[str, Any]:
    if table not in COLUMNS:
        raise Problem(404, "not_found", f"no table {table!r}")
    if not isinstance(row, Mapping) or not row or any(c not in COLUMNS[table] for c in row):
        raise Problem(422, "invalid_request", f"bad row for {table}: {row!r}")
    return dict(row)


class Writes:
    """One write request's parts, gathered into ONE stream entry."""

    def __init__(self, history: RedisHistory):
        self.history = history
        self.fields: dict[str, Any] = {}
        self.results: list[dict[str, Any]] = []
        self._marks: dict[str, dict[str, Any]] | None = None

    def marks(self) -> dict[str, dict[str, Any]]:
        if self._marks is None:
            self._marks = self.history.marks()
        return self._marks

    def counter(self, key: Any, row: dict[str, Any]) -> None:
        if str(key) != "1" or "c_op" in self.fields:
            raise Problem(404, "not_found", f"no row {key!r} in counter")
        new = {**self.history.counter(), **row, "id": 1}
        if any(new.get(c) is None for c in ("value", "op", "worker", "fence", "read_value")):
            raise Problem(422, "invalid_request", "a counter write names value, op, worker, "
                                                  "fence and read_value")
        self.fields.update(c_op=new["op"], c_worker=new["worker"], c_fence=int(new["fence"]),
                           c_read=int(new["read_value"]), c_value=int(new["value"]))
        self.results.append(new)

    def insert(self, row: dict[str, Any], replay_ok: bool = True) -> None:
        mark = {"id": str(row.get("id")), "worker": str(row.get("worker")),
                "fence": int(row.get("fence") or 0)}
        existing = self.marks().get(mark["id"])
        if existing is not None:
            if existing != mark or not replay_ok:
                raise Problem(409, "conflict", f"row {mark['id']!r} of marks exists")
        elif "m_id" in self.fields:
            raise Problem(422, "invalid_request", "one mark insert per write here")
        else:
            self.fields.update(m_id=mark["id"], m_worker=mark["worker"], m_fence=mark["fence"])
        self.results.append(mark)

    def delete(self, key: str) -> None:
        if key not in self.marks() or "d_id" in self.fields:
            raise Problem(404, "not_found", f"no row {key!r} in marks")
        self.fields["d_id"] = key
        self.results.append({"id": key})


def create_app(lockd: str | FenceGuard, redis_url: str, prefix: str, tag: str,
               lock: str) -> FastAPI:
    """The service: ``lockd`` (its URL, or a ready ``FenceGuard``) verifies the tokens; the
    run's library (``run_library(tag)``) must be loaded in the Redis at ``redis_url``."""
    guard = lockd if isinstance(lockd, FenceGuard) else FenceGuard(lockd)
    client = redis.Redis.from_url(redis_url, socket_timeout=5, socket_connect_timeout=5)
    fences, history = RunFences(client, prefix, tag), RedisHistory(client, prefix)
    app = FastAPI(title="chaos counter, guarded in Redis")
    add_problem_handlers(app)

    @app.exception_handler(Problem)
    async def problem(request: Request, exc: Exception) -> Any:
        assert isinstance(exc, Problem)
        return error_response(exc)

    @app.exception_handler(redis.RedisError)
    async def unavailable(request: Request, exc: Exception) -> Any:
        return error_response(Problem(503, "redis_unavailable", str(exc)[:200]))

    def claimed(fence: Fence) -> int:
        """Claim ``fence``; log the highest it left as a ``fence`` entry (appended after the
        claim: a lower bound of when the highest rose, which can hide a stale write from the
        checker's database-order check, never accuse a fresh one)."""
        highest = fences.claim(fence)
        client.xadd(history.stream, {"f_high": highest})
        return highest

    def read(request: Request, work: Any) -> Any:
        if request.headers.get(HEADER):
            claimed(guard.check(request.headers.get(HEADER), lock, purpose=READ))
        return work()

    def write(request: Request, parts: Any) -> list[dict[str, Any]]:
        fence = guard.check(request.headers.get(HEADER), lock, purpose=WRITE)
        w = Writes(history)
        parts(w)
        if w.fields:  # the write: fence checked and raised, entry appended, in one call
            fences.xadd(fence, history.stream, {**w.fields, "f_high": fence.fence})
        else:  # a replayed insert: nothing to append, the fence still checked
            claimed(fence)
        return w.results

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/fences/{name:path}/claim")
    def claim(name: str, request: Request) -> dict[str, Any]:
        fence = guard.check(request.headers.get(HEADER), name, purpose=READ)
        if name != lock:
            raise Problem(403, "lock_not_allowed", f"lock {name!r} governs nothing here")
        return {"lock": lock, "highest": claimed(fence)}

    @app.get("/v1/tables/{table}/rows/{key}")
    def get(table: str, key: str, request: Request) -> dict[str, Any]:
        _row(table, {"id": key})
        if table == "counter" and key == "1":
            return read(request, history.counter)
        found = read(request, history.marks).get(key) if table == "marks" else None
        if found is None:
            raise Problem(404, "not_found", f"no row {key!r} in {table}")
        return found

    def _one(table: str, key: str | None, row: dict[str, Any], w: Writes, kind: str) -> None:
        if table == "counter":
            w.counter(key if key is not None else row.get("id"), row)
        elif kind == "delete":
            w.delete(str(key))
        else:
            w.insert({**row, "id": key if key is not None else row.get("id")},
                     replay_ok=kind != "update")

    @app.patch("/v1/tables/{table}/rows/{key}")
    async def patch(table: str, key: str, request: Request) -> dict[str, Any]:
        row = _row(table, await request.json())
        return (await run_in_threadpool(write, request,
                                        lambda w: _one(table, key, row, w, "update")))[0]

    @app.put("/v1/tables/{table}/rows/{key}")
    async def put(table: str, key: str, request: Request) -> dict[str, Any]:
        row = _row(table, await request.json())
        return (await run_in_threadpool(write, request,
                                        lambda w: _one(table, key, row, w, "upsert")))[0]

    @app.post("/v1/tables/{table}/rows", status_code=201)
    async def post(table: str, request: Request) -> dict[str, Any]:
        row = _row(table, await request.json())
        return (await run_in_threadpool(write, request,
                                        lambda w: _one(table, None, row, w, "insert")))[0]

    @app.delete("/v1/tables/{table}/rows/{key}", status_code=204)
    def delete(table: str, key: str, request: Request) -> None:
        _row(table, {"id": key})
        write(request, lambda w: _one(table, key, {}, w, "delete"))

    @app.post("/v1/batch")
    async def batch(request: Request) -> dict[str, Any]:
        body = await request.json()
        ops = body.get("ops") if isinstance(body, Mapping) else None
        if not isinstance(ops, list) or not ops or not all(isinstance(o, Mapping) for o in ops):
            raise Problem(422, "invalid_request", "a batch is {ops: [...]}")

        def parts(w: Writes) -> None:
            for op in ops:
                table, kind = op.get("table"), op.get("op")
                if kind not in ("update", "upsert", "insert", "delete"):
                    raise Problem(422, "invalid_request", f"unknown op {kind!r}")
                row = _row(table, op.get("row") or {"id": op.get("key")})
                key = op.get("key")
                _one(table, None if key is None else str(key), row, w, kind)

        return {"results": await run_in_threadpool(write, request, parts)}

    return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m chaos.redisguarded",
                                description=__doc__.splitlines()[0])
    p.add_argument("--lockd", required=True)
    p.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    p.add_argument("--prefix", required=True, help="of the run's keys, e.g. chaos:RUN:")
    p.add_argument("--tag", required=True, help="the run's library suffix (run_library)")
    p.add_argument("--lock", required=True)
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args(argv)
    client = redis.Redis.from_url(args.redis)
    _name, text = run_library(args.tag)
    client.function_load(text, replace=True)
    client.close()
    uvicorn.run(create_app(args.lockd, args.redis, args.prefix, args.tag, args.lock),
                host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
