"""A guarded service: FastAPI + Redis 7. Cache entries are written under lock ``cache/{key}``
through the guard's Redis functions (``RedisFences``): the fence check, its raise and the SET
run in one function call, so a superseded holder's write never lands.

    python -m lockd.guard redis install --redis-url redis://127.0.0.1:6379/0
    python examples/cache_redis.py --lockd-url http://127.0.0.1:7070 --port 8082
    lockctl conformance http://127.0.0.1:8082 --lock cache/k --write 'PUT /cache/k {"value": 1}'
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import redis
import uvicorn
from fastapi import Body, Depends, FastAPI, HTTPException

from lockd.common.fencerule import Fence
from lockd.guard import FenceGuard
from lockd.guard.redis import RedisFences, install
from lockd.guard.web import Fenced, add_problem_handlers


def create_app(lockd_url: str, redis_url: str, prefix: str = "cache:") -> FastAPI:
    guard, client = FenceGuard(lockd_url), redis.Redis.from_url(redis_url)
    install(client)  # idempotent; a deployment would run `python -m lockd.guard redis install`
    fences = RedisFences(client, prefix=prefix + "fence:")
    app = FastAPI(title="cache (guarded, Redis functions)")
    add_problem_handlers(app)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.put("/cache/{key}")
    def put_entry(key: str, body: dict[str, Any] = Body(...),
                  fence: Fence = Depends(Fenced("cache/{key}", guard=guard))) -> dict:
        ttl = body.get("ttl_ms")
        fences.set(fence, prefix + key, json.dumps(body.get("value")),
                   ttl_ms=ttl if isinstance(ttl, int) and ttl > 0 else None)
        return {"key": key, "fence": fence.fence}

    @app.get("/cache/{key}")
    def get_entry(key: str) -> dict:
        value = client.get(prefix + key)
        if value is None:
            raise HTTPException(404, "no such entry")
        return {"key": key, "value": json.loads(value)}

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lockd-url", default="http://127.0.0.1:7070")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--prefix", default="cache:", help="of every Redis key it writes")
    parser.add_argument("--port", type=int, default=8082)
    args = parser.parse_args()
    uvicorn.run(create_app(args.lockd_url, args.redis_url, args.prefix), host="127.0.0.1",
                port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
