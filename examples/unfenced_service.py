"""A deliberately BROKEN service, for the conformance probe to fail: it verifies the token
(signature, lock, mode) but keeps no fence store, so a superseded holder's write lands.
Never copy it: verification alone does not fence.

    python examples/unfenced_service.py --lockd-url http://127.0.0.1:7070 --port 8083
"""

from __future__ import annotations

import argparse
from typing import Any

import uvicorn
from fastapi import Body, Depends, FastAPI

from lockd.common.fencerule import Fence
from lockd.guard import FenceGuard
from lockd.guard.web import Fenced, add_problem_handlers


def create_app(lockd_url: str) -> FastAPI:
    guard, data = FenceGuard(lockd_url), {}
    app = FastAPI(title="unfenced (broken on purpose)")
    add_problem_handlers(app)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.put("/things/{thing}")
    def put_thing(thing: str, body: dict[str, Any] = Body(...),
                  fence: Fence = Depends(Fenced("things/{thing}", guard=guard))) -> dict:
        data[thing] = body  # no fence store: the bug
        return {"thing": thing, "fence": fence.fence}

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lockd-url", default="http://127.0.0.1:7070")
    parser.add_argument("--port", type=int, default=8083)
    args = parser.parse_args()
    uvicorn.run(create_app(args.lockd_url), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
