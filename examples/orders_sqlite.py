"""A guarded service: FastAPI + SQLite. Orders are written under lock ``orders/{order_id}``;
the fence is claimed in the SQLite transaction that writes the order (``SqliteFences``), so a
superseded holder's write is refused (409) even after the service restarts.

    python examples/orders_sqlite.py --lockd-url http://127.0.0.1:7070 --db orders.db --port 8081
    curl -X PUT localhost:8081/orders/42 -H "Fencing-Token: $LOCKD_TOKEN" -d '{"item": "tea"}'
    lockctl conformance http://127.0.0.1:8081 --lock orders/42 --write 'PUT /orders/42 {"item": "tea"}'
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from typing import Any

import uvicorn
from fastapi import Body, Depends, FastAPI, HTTPException

from lockd.common.fencerule import Fence
from lockd.guard import FenceGuard, SqliteFences
from lockd.guard.web import Fenced, add_problem_handlers


def create_app(lockd_url: str, db: str) -> FastAPI:
    guard, fences = FenceGuard(lockd_url), SqliteFences()

    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(db, timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")
        return conn

    with connect() as conn:
        fences.install(conn)
        conn.execute("CREATE TABLE IF NOT EXISTS orders "
                     "(id TEXT PRIMARY KEY, body TEXT NOT NULL, fence INTEGER NOT NULL)")
    app = FastAPI(title="orders (guarded, SQLite)")
    add_problem_handlers(app)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.put("/orders/{order_id}")
    def put_order(order_id: str, body: dict[str, Any] = Body(...),
                  fence: Fence = Depends(Fenced("orders/{order_id}", guard=guard))) -> dict:
        conn = connect()
        try:
            with fences.transaction(conn, fence):  # BEGIN IMMEDIATE; claim; write; COMMIT
                conn.execute("INSERT INTO orders (id, body, fence) VALUES (?, ?, ?) ON CONFLICT "
                             "(id) DO UPDATE SET body = excluded.body, fence = excluded.fence",
                             (order_id, json.dumps(body), fence.fence))
        finally:
            conn.close()
        return {"order_id": order_id, "fence": fence.fence, **body}

    @app.get("/orders/{order_id}")
    def get_order(order_id: str) -> dict:
        with connect() as conn:
            row = conn.execute("SELECT body, fence FROM orders WHERE id = ?", (order_id,)).fetchone()
        if row is None:
            raise HTTPException(404, "no such order")
        return {"order_id": order_id, "fence": row[1], **json.loads(row[0])}

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lockd-url", default="http://127.0.0.1:7070")
    parser.add_argument("--db", default="orders.db")
    parser.add_argument("--port", type=int, default=8081)
    args = parser.parse_args()
    uvicorn.run(create_app(args.lockd_url, args.db), host="127.0.0.1", port=args.port,
                log_level="warning")


if __name__ == "__main__":
    main()
