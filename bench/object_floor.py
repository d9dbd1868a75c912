"""Section 10's design floor: the least any fenced-object design where the database decides
must do per PUT, as one minimal ASGI app on the proxy's uvicorn (uvloop, httptools, access log
off, one process). Not the proxy: no token, no hash, no fence, no precondition, no
Idempotency-Key, no ETag.

Per ``PUT /v1/objects/{bucket}/{key}``:

- the body received (pieces kept, never joined for a file);
- larger than ``inline_max`` bytes (16 KiB, the proxy's ``--objects-inline-max`` default): the
  file written exactly as section 10's direct baseline writes it (a temporary file written,
  fsync'ed, renamed over ``{dir}/{bucket}/{key}``, the directory fsync'ed), in a worker thread;
- then ONE upsert of the object's pointer row ``(bucket, key, blob, size, body)`` committed
  durably (an autocommit statement, ``synchronous_commit = on``) through psycopg async on a
  connection of a small pool (one per concurrent request, opened on demand); at most
  ``inline_max`` bytes: the row carries the body (the inline design: no file at all).

Any other request (``GET /healthz``) answers ``{}``. Run by ``bench.objects`` (``serve``)::

    python -m bench.object_floor PORT DSN DIR [INLINE_MAX]
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["app_for", "serve", "write_file"]

INLINE_MAX = 16 * 1024
TABLE = "floor_objects"
_DDL = (f"CREATE TABLE IF NOT EXISTS {TABLE} (bucket text NOT NULL, key text NOT NULL, "
        "blob text NOT NULL, size bigint NOT NULL, body bytea, PRIMARY KEY (bucket, key))")
_UPSERT = (f"INSERT INTO {TABLE} (bucket, key, blob, size, body) VALUES (%s, %s, %s, %s, %s) "
           "ON CONFLICT (bucket, key) DO UPDATE SET blob = excluded.blob, "
           "size = excluded.size, body = excluded.body")
_IOV = 1024  # writev's limit on pieces per call (IOV_MAX)
_OK = {"type": "http.response.body", "body": b"{}"}


def write_file(directory: Path, name: str, pieces: list[bytes], n: int) -> None:
    """The direct baseline's durable write of a body given in ``pieces`` (``bench.objects``
    writes its files with it too): a temporary file written and fsynced, renamed to ``name``
    in ``directory``, the directory fsynced."""
    temp = directory / f".{name}.{n}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for i in range(0, len(pieces), _IOV):
            group = pieces[i:i + _IOV]
            left = sum(map(len, group))
            while left:
                done = os.writev(fd, group)
                left -= done
                while group and done >= len(group[0]):
                    done -= len(group[0])
                    group = group[1:]
                if done:
                    group = [memoryview(group[0])[done:], *group[1:]]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(temp, directory / name)
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def app_for(dsn: str, directory: Path, inline_max: int = INLINE_MAX) -> Any:
    """The ASGI app: PUTs as the module says, on PostgreSQL at ``dsn`` (table made at start)."""
    import psycopg

    idle: list[Any] = []  # pooled connections, autocommit
    made: set[Path] = set()
    count = [0]

    async def connect() -> Any:
        conn = await psycopg.AsyncConnection.connect(
            dsn, autocommit=True, prepare_threshold=0, options="-c synchronous_commit=on")
        return conn

    async def put(scope: dict, pieces: list[bytes]) -> None:
        _, _, _, bucket, key = scope["path"].split("/", 4)
        size = sum(map(len, pieces))
        if size > inline_max:
            directory_of = directory / bucket
            if directory_of not in made:
                directory_of.mkdir(parents=True, exist_ok=True)
                made.add(directory_of)
            count[0] += 1
            await asyncio.to_thread(write_file, directory_of, key, pieces, count[0])
            body = None
        else:
            body = b"".join(pieces)
        conn = idle.pop() if idle else await connect()
        try:
            await conn.execute(_UPSERT, (bucket, key, f"{bucket}/{key}", size, body))
        except BaseException:
            await conn.close()
            raise
        idle.append(conn)

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    conn = await connect()
                    await conn.execute(_DDL)
                    idle.append(conn)
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    for conn in idle:
                        await conn.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        pieces: list[bytes] = []
        while True:
            message = await receive()
            if message.get("body"):
                pieces.append(message["body"])
            if not message.get("more_body"):
                break
        status = 200
        if scope["method"] == "PUT" and scope["path"].startswith("/v1/objects/"):
            try:
                await put(scope, pieces)
            except Exception as exc:  # shown to the generator as an error, not swallowed
                print(f"floor PUT failed: {exc!r}", file=sys.stderr)
                status = 500
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send(_OK)

    return app


def serve(ws: Any, name: str = "object-floor") -> Any:
    """Start the floor app on a fresh database of ``ws`` (a ``bench.peers.Workspace``); its
    blobs under ``ws.dir / name``. Returns the ``bench.peers.Server``."""
    from bench.peers import PYTHON, Server
    from harness import ServiceProcess, free_port

    port = free_port()
    proc = ServiceProcess([PYTHON, "-m", "bench.object_floor", str(port), ws.database(),
                           str(ws.dir / name)], ready_url=f"http://127.0.0.1:{port}/healthz",
                          cwd=Path(__file__).resolve().parents[1],
                          log_path=ws.dir / f"{name}.log").start(timeout=30)
    server = Server(name, "127.0.0.1", port, proc)
    ws.servers.append(server)
    return server


def main(argv: list[str]) -> int:
    import uvicorn

    port, dsn, directory = int(argv[0]), argv[1], Path(argv[2])
    inline_max = int(argv[3]) if len(argv) > 3 else INLINE_MAX
    uvicorn.run(app_for(dsn, directory, inline_max), host="127.0.0.1", port=port,
                log_level="warning", access_log=False, server_header=False, lifespan="on")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
