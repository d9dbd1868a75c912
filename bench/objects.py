"""Section 10 of ``make bench``: fenced object PUTs through the proxy (``/v1/objects``).

Rows (PUTs/s and MB/s at 4 KiB and 1 MiB, 1 and ``BENCH_PROXY_CLIENTS`` clients):

- through the proxy: ``PUT /v1/objects/bench{i}/{n % 8}`` with the client's token (client i
  writes bucket ``bench{i}``, so lock ``bench{i}``, fence 1: clients do not contend, the
  figures show the proxy's cost, not lock waits), blobs in a directory (``--objects-dir``), PostgreSQL as its database:
  the body streamed to a new blob (written, fsync'ed, renamed, directory fsync'ed), then one
  transaction that checks the fence and moves the pointer, then the replaced blob deleted;
- the same files written straight to a directory (the baseline): a temporary file written,
  fsync'ed, renamed over ``c{i}/{n % 8}``, the directory fsync'ed: the same durability, no
  fence, no pointer, no HTTP;
- at 4 KiB, the same proxy setup with ``--objects-inline-max 0`` (every body a blob: what a
  small PUT cost before small bodies were kept in the pointer row, in the same run);
- the HTTP ceiling: the same PUTs to a do-nothing ASGI app on the same uvicorn that receives
  the body and drops it (``bench.http_ceiling``): the most any one-process Python proxy on this
  HTTP stack could do, before any hashing, writing or transaction;
- the design floor (``bench.object_floor``): the same PUTs to a minimal ASGI app on the same
  uvicorn that does only what any design where the database decides must do: receive the body,
  write it as the baseline does (a blob-sized body; a 4 KiB one is not written), then commit ONE
  durable upsert of a pointer row (carrying a 4 KiB body) through psycopg async. No token, hash,
  fence or precondition: the most this design can deliver on this machine.

The proxy's memory: its resident set before the rows of a size and its peak (``VmHWM``) after
them: what streaming keeps bounded (at most 1 MiB of a body is buffered per request).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.object_floor import write_file
from bench.report import Section, median, pct, ratio

__all__ = ["WORKLOADS", "objects"]

SIZES = (("4 KiB", 4096), ("1 MiB", 1 << 20))
INLINE_DEFAULT = 16 * 1024  # the proxy's --objects-inline-max default
BLOB_ONLY = "fenced PUT through the proxy, every body a blob (--objects-inline-max 0)"
KEYED = ("fenced PUT through the proxy with an Idempotency-Key (what FencedSession.put_object "
         "sends)")
CEILING = "received by a do-nothing ASGI app on the same uvicorn (the HTTP ceiling)"
FLOOR = ("DESIGN-FLOOR: receive, the baseline's file write (blob sizes), one durable pointer "
         "upsert (psycopg async)")
_SLOTS = 8  # keys per client, written in turn


async def _proxy_put(spec: dict, i: int) -> tuple[Callable[[], Awaitable[None]],
                                                  Callable[[], Awaitable[None]]]:
    from bench.loadgen import Http, HttpError

    http = await Http(spec["host"], spec["port"]).connect()
    body = os.urandom(spec["size"])
    headers = (f"Fencing-Token: {spec['tokens'][i]}\r\n"
               "Content-Type: application/octet-stream\r\n")
    keyed = spec.get("keyed", False)
    n = 0

    async def cycle() -> None:
        nonlocal n
        n += 1
        extra = f"Idempotency-Key: {os.urandom(16).hex()}\r\n" if keyed else ""
        status, data = await http.request("PUT", f"/v1/objects/bench{i}/{n % _SLOTS}", body,
                                          headers + extra)
        if status not in (200, 201):
            raise HttpError(status, data)

    return cycle, http.close


async def _direct_file(spec: dict, i: int) -> tuple[Callable[[], Awaitable[None]],
                                                    Callable[[], Awaitable[None]]]:
    directory = Path(spec["dir"]) / f"c{i}"
    directory.mkdir(parents=True, exist_ok=True)
    body = os.urandom(spec["size"])
    n = 0

    async def cycle() -> None:
        nonlocal n
        n += 1
        await asyncio.to_thread(write_file, directory, str(n % _SLOTS), [body], n)

    async def close() -> None:
        return None

    return cycle, close


_S3_CLIENTS: dict[str, tuple[Any, contextlib.AsyncExitStack, list[int]]] = {}


async def _direct_s3(spec: dict, i: int) -> tuple[Callable[[], Awaitable[None]],
                                                  Callable[[], Awaitable[None]]]:
    """PUTs straight to the S3 server with aiobotocore (the library the proxy's S3 store uses),
    ONE client (one connection pool) shared by the generator process's clients, as the proxy
    shares one; one PUT made before the count, so credentials and connections are ready.
    Client i writes ``c{i}/{n % 8}`` of the bucket ``spec["bucket"]``."""
    from aiobotocore.session import get_session
    from botocore.config import Config

    url = spec["s3_url"]
    if url not in _S3_CLIENTS:
        stack = contextlib.AsyncExitStack()
        _S3_CLIENTS[url] = (None, stack, [0])
        client = await stack.enter_async_context(get_session().create_client(
            "s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="test",
            aws_secret_access_key="test",
            config=Config(s3={"addressing_style": "path"}, max_pool_connections=64)))
        _S3_CLIENTS[url] = (client, stack, [0])
    while _S3_CLIENTS[url][0] is None:  # another client of this process is making it
        await asyncio.sleep(0.01)
    client, stack, users = _S3_CLIENTS[url]
    users[0] += 1
    body = os.urandom(spec["size"])
    n = 0

    async def cycle() -> None:
        nonlocal n
        n += 1
        await client.put_object(Bucket=spec["bucket"], Key=f"c{i}/{n % _SLOTS}", Body=body)

    async def close() -> None:
        users[0] -= 1
        if users[0] == 0:
            _S3_CLIENTS.pop(url, None)
            await stack.aclose()

    await cycle()
    return cycle, close


WORKLOADS = {"proxy_object_put": _proxy_put, "direct_file_write": _direct_file,
             "direct_s3_put": _direct_s3}


def _hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def objects(bench: Any) -> Section:
    """Fenced PUTs/s through the proxy beside the same files written straight to a directory."""
    from bench import loadgen, object_floor
    from bench.http_ceiling import raw_asgi
    from bench.peers import rss_mb
    from lockd.tokens import KeyRing

    s = bench.settings
    clients = sorted({1, *s.proxy_clients})
    dsn = bench.ws.database()
    ring = KeyRing.generate()
    blobs = bench.ws.dir / "bench-objects"
    server = bench.ws.proxy(dsn, ring.jwks(), "tables: {}\n", name="proxy-objects",
                            args=("--objects-dir", str(blobs), "--max-object-bytes",
                                  str(4 << 20)))
    every_blob = bench.ws.proxy(bench.ws.database(), ring.jwks(), "tables: {}\n",
                                name="proxy-objects-blobs",
                                args=("--objects-dir", str(bench.ws.dir / "bench-objects-blobs"),
                                      "--max-object-bytes", str(4 << 20),
                                      "--objects-inline-max", "0"))
    ceiling = raw_asgi(bench.ws)
    floor = object_floor.serve(bench.ws)
    tokens = [ring.sign(f"bench{i}", 1) for i in range(max(clients))]
    direct = bench.ws.dir / "bench-direct"
    baseline = "the same files written to a directory (baseline)"
    proxied = "fenced PUT through the proxy"
    res: dict[tuple[str, str, int], list[dict]] = {}
    memory: dict[str, tuple[float, float]] = {}
    pid = server.proc.pid
    for label, size in SIZES:
        before = rss_mb(pid)
        paths = [(baseline, {"workload": "direct_file_write", "dir": str(direct)}),
                 (proxied, {"workload": "proxy_object_put", **server.addr(), "tokens": tokens})]
        if size <= INLINE_DEFAULT:
            paths.append((KEYED, {"workload": "proxy_object_put", **server.addr(),
                                  "tokens": tokens, "keyed": True}))
            paths.append((BLOB_ONLY, {"workload": "proxy_object_put", **every_blob.addr(),
                                      "tokens": tokens}))
        paths.append((CEILING, {"workload": "proxy_object_put", **ceiling.addr(),
                                "tokens": tokens}))
        paths.append((FLOOR, {"workload": "proxy_object_put", **floor.addr(), "tokens": tokens}))
        for _ in range(s.rounds):
            for c in clients:
                for name, spec in paths:
                    out = loadgen.run_closed({**spec, "size": size, "warmup": s.warmup,
                                              "seconds": s.seconds}, c, s.procs)
                    res.setdefault((name, label, c), []).append(out)
        memory[label] = (before, _hwm_mb(pid))
    section = Section(
        "10", "Fenced objects: PUT through the proxy vs the same files written directly",
        "the same bytes written straight to a directory (write, fsync, rename, fsync dir), "
        "same clients; for S3, PUTs straight to the same S3 server",
        [("path", "str"), ("size", "str"), ("clients", "int"), ("PUTs/s", "int"),
         ("MB/s", "int"), ("× direct", "x"), ("p50 ms", "ms"), ("p99 ms", "ms"),
         ("errors", "int")])
    for label, size in SIZES:
        for c in clients:
            base = median([x["cycles"] / x["seconds"] for x in res[(baseline, label, c)]])
            for name in (baseline, proxied, KEYED, BLOB_ONLY, FLOOR, CEILING):
                if (name, label, c) not in res:
                    continue
                runs = res[(name, label, c)]
                rate = median([x["cycles"] / x["seconds"] for x in runs])
                lat = [v for x in runs for v in x["lat_ms"]]
                section.rows.append([name, label, c, rate, rate * size / 1e6, ratio(rate, base),
                                     pct(lat, 50), pct(lat, 99),
                                     sum(x["errors"] for x in runs)])
                section.data[f"{name} · {label} @{c}"] = {
                    "puts_per_s": [x["cycles"] / x["seconds"] for x in runs],
                    "bytes_per_s": [x["cycles"] * size / x["seconds"] for x in runs],
                    "first_error": next((x["first_error"] for x in runs if x["first_error"]),
                                        None)}
    _s3_rows(bench, section, clients, dsn, ring, tokens)
    most = max(clients)
    section.data["proxy_rss_mb"] = {label: {"before": b, "peak": p}
                                    for label, (b, p) in memory.items()}
    (b4, p4), (b1, p1) = memory["4 KiB"], memory["1 MiB"]
    section.notes.append(
        f"The proxy's resident set: {b4:.0f} MiB before the 4 KiB rows, peak {p4:.0f} MiB; "
        f"{b1:.0f} MiB before the 1 MiB rows, peak {p1:.0f} MiB with {most} concurrent 1 MiB "
        "PUTs ((peak - before) / clients bounds the memory of one request: bodies are streamed, "
        "at most 1 MiB buffered each). Client i writes its own 8 keys of bucket bench{i} in "
        "turn (lock bench{i}, fence 1); the proxy's database is PostgreSQL. A 4 KiB body is "
        f"kept in its pointer row (at most {INLINE_DEFAULT // 1024} KiB by default: one flush, "
        "the transaction's); a 1 MiB body is a blob (file fsync, directory fsync, then the "
        "transaction). The goal's row sends no Idempotency-Key: on PostgreSQL a small body's "
        "PUT is then one round trip (the claim and the move as one transaction); with a key "
        "(the Python client's default, resendable after a lost answer) the key's record is "
        "claimed and written in the same transaction, a few round trips more.")
    section.notes.append(
        "DESIGN-FLOOR rows: a minimal ASGI app on the same uvicorn (bench/object_floor.py) that "
        "receives the body, writes a blob-sized one exactly as the baseline does (write, fsync, "
        "rename, directory fsync) and commits ONE upsert of a pointer row in PostgreSQL "
        "(autocommit, synchronous_commit on, psycopg async; the row carries a body of at most "
        f"{INLINE_DEFAULT // 1024} KiB, which is then not written to a file): no token, hash, "
        "fence, precondition or idempotency record. What any design where the database decides "
        "must pay per PUT; the goals' limit column shows it as the same ratio.")
    return section


S3_BASELINE = "PUT straight to the S3 server (moto, baseline)"
S3_PROXIED = "fenced PUT through the proxy on S3"


def _s3_rows(bench: Any, section: Section, clients: list[int], dsn: str, ring: Any,
             tokens: list[str]) -> None:
    """The same PUTs with an S3 server (moto in server mode, from the venv) as the blob store:
    through the proxy (``--objects-s3-url``) against PUTs straight to the same server. Skipped,
    with a note, when ``moto_server`` is not installed."""
    from bench import loadgen
    from harness import VENV_BIN, ServiceProcess, free_port

    binary = VENV_BIN / "moto_server"
    if not binary.exists():
        section.notes.append("S3 rows skipped: moto_server is not installed "
                             "(pip install 'moto[server]').")
        return
    s = bench.settings
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
           "AWS_DEFAULT_REGION": "us-east-1"}
    moto = ServiceProcess([str(binary), "-H", "127.0.0.1", "-p", str(port)],
                          ready_url=f"{url}/moto-api/", env=env,
                          log_path=bench.ws.dir / "moto.log").start(timeout=60)
    try:
        import botocore.session

        botocore.session.get_session().create_client(
            "s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="test",
            aws_secret_access_key="test").create_bucket(Bucket="bench-direct")
        server = bench.ws.proxy(dsn, ring.jwks(), "tables: {}\n", name="proxy-objects-s3",
                                env=env, args=("--objects-s3-url", url, "--objects-s3-bucket",
                                               "bench-proxy", "--max-object-bytes",
                                               str(4 << 20)))
        res: dict[tuple[str, str, int], list[dict]] = {}
        for label, size in SIZES:
            for _ in range(s.rounds):
                for c in clients:
                    for name, spec in ((S3_BASELINE, {"workload": "direct_s3_put", "s3_url": url,
                                                      "bucket": "bench-direct"}),
                                       (S3_PROXIED, {"workload": "proxy_object_put",
                                                     **server.addr(), "tokens": tokens})):
                        out = loadgen.run_closed({**spec, "size": size, "warmup": s.warmup,
                                                  "seconds": s.seconds}, c, s.procs)
                        res.setdefault((name, label, c), []).append(out)
        server.stop()
    finally:
        moto.stop()
    for label, size in SIZES:
        for c in clients:
            base = median([x["cycles"] / x["seconds"] for x in res[(S3_BASELINE, label, c)]])
            for name in (S3_BASELINE, S3_PROXIED):
                runs = res[(name, label, c)]
                rate = median([x["cycles"] / x["seconds"] for x in runs])
                lat = [v for x in runs for v in x["lat_ms"]]
                section.rows.append([name, label, c, rate, rate * size / 1e6, ratio(rate, base),
                                     pct(lat, 50), pct(lat, 99),
                                     sum(x["errors"] for x in runs)])
                section.data[f"{name} · {label} @{c}"] = {
                    "puts_per_s": [x["cycles"] / x["seconds"] for x in runs],
                    "bytes_per_s": [x["cycles"] * size / x["seconds"] for x in runs],
                    "first_error": next((x["first_error"] for x in runs if x["first_error"]),
                                        None)}
    section.notes.append(
        "S3 rows: moto's server (Python, in-memory) on loopback as the S3 endpoint; the "
        "baseline PUTs with aiobotocore (the proxy's own S3 library; moto closes every "
        "connection), client i its 8 keys c{i}/*; through the proxy each PUT is one S3 PUT of a new blob, the fence's "
        "transaction, then one S3 DELETE of the replaced blob.")
