"""``FencedSession``/``AsyncFencedSession`` object calls and the ``output`` helper against a
real lockd and a real proxy serving ``--objects-dir``: bodies from bytes, paths, files and
iterators, reads into files, ranges, listing, deletes, and the revived holder refused."""

from __future__ import annotations

import asyncio
import io
import os
import uuid
from pathlib import Path

import pytest

from harness import VENV_BIN, run_program
from harness.servers import ProxyServer
from lockd import AsyncLockClient, LockClient, StaleTokenError
from lockd.client.errors import NotFoundError, PreconditionFailed
from lockd.client.fenced import AsyncFencedSession, FencedSession
from tests.client.conftest import _workdir


@pytest.fixture(scope="module")
def objects_proxy(shared_lockd):
    workdir = _workdir("proxy-objects-")
    proxy = ProxyServer(f"sqlite:///{workdir / 'res.db'}", shared_lockd.url, log_dir=workdir,
                        objects_dir=workdir / "objects").start()
    yield proxy.url
    assert proxy.stop() == 0, proxy.log()


def _bucket() -> str:
    return f"ob{uuid.uuid4().hex[:10]}"


def test_sync_object_calls(shared_lockd, objects_proxy, tmp_path: Path):
    b = _bucket()
    source = tmp_path / "in.bin"
    source.write_bytes(os.urandom(3 * (1 << 20) + 5))  # several chunks
    with LockClient(shared_lockd.url) as client, client.lock(b, ttl=10) as lease, \
            FencedSession(objects_proxy, lease) as db:
        made = db.put_object(b, "a/bytes", b"hello", content_type="text/plain")
        assert (made["version"], made["size"], made["fence"]) == (1, 5, lease.fence)
        assert db.put_file(b, "a/file", source)["size"] == source.stat().st_size
        with open(source, "rb") as file:
            file.seek(5)
            assert db.put_object(b, "a/fileobj", file)["size"] == source.stat().st_size - 5
        assert db.put_object(b, "a/iter", iter([b"x" * 10, b"y" * 10]))["size"] == 20
        assert db.get_object(b, "a/bytes") == b"hello"
        assert db.get_object(b, "a/bytes", range=(1, 3)) == b"el"
        out = tmp_path / "out.bin"
        assert db.get_object(b, "a/file", into=out) == source.stat().st_size
        assert out.read_bytes() == source.read_bytes()
        sink = io.BytesIO()
        db.get_object(b, "a/iter", into=sink)
        assert sink.getvalue() == b"x" * 10 + b"y" * 10
        head = db.head_object(b, "a/bytes")
        assert head["etag"] == made["etag"] and head["content_type"].startswith("text/plain")
        with pytest.raises(PreconditionFailed):
            db.put_object(b, "a/bytes", b"again", if_none_match=True)
        replaced = db.put_object(b, "a/bytes", b"again", if_match=made["etag"])
        assert replaced["version"] == 2
        keys = [i["key"] for i in db.list_objects(b, "a/")]
        assert keys == ["a/bytes", "a/file", "a/fileobj", "a/iter"]
        assert [i["key"] for i in db.list_objects(b, limit=2)] == ["a/bytes", "a/file"]
        db.delete_object(b, "a/iter")
        with pytest.raises(NotFoundError):
            db.get_object(b, "a/iter")


def test_the_revived_holders_output_never_becomes_visible(shared_lockd, objects_proxy):
    b = _bucket()
    with LockClient(shared_lockd.url) as client:
        old = client.acquire(b, 10, auto_renew=False)
        stale = FencedSession(objects_proxy, old)
        with stale.output(b, "result.csv") as out:
            out.write(b"first run\n")
        assert out.result is not None and out.result["fence"] == old.fence
        client.release(old)  # the old holder "freezes"; a new one takes over and writes
        with client.lock(b, ttl=10) as new, FencedSession(objects_proxy, new) as db:
            with db.output(b, "result.csv") as out:
                out.write(b"second run\n")
            with pytest.raises(StaleTokenError):
                with stale.output(b, "result.csv") as out:  # the revived holder
                    out.write(b"stale run\n")
            with pytest.raises(RuntimeError):
                with db.output(b, "other.csv") as out:
                    out.write(b"half")
                    raise RuntimeError("the job failed")
            assert db.get_object(b, "result.csv") == b"second run\n"
            assert [i["key"] for i in db.list_objects(b)] == ["result.csv"]
        stale.close()


def test_async_object_calls(shared_lockd, objects_proxy, tmp_path: Path):
    b = _bucket()
    source = tmp_path / "in.bin"
    source.write_bytes(os.urandom((1 << 20) + 7))

    async def chunks():
        for part in (b"ab", b"cd"):
            yield part

    async def main() -> None:
        async with AsyncLockClient(shared_lockd.url) as client:
            async with client.lock(b, ttl=10) as lease:
                async with AsyncFencedSession(objects_proxy, lease) as db:
                    assert (await db.put_object(b, "k/bytes", b"abc"))["size"] == 3
                    assert (await db.put_object(b, "k/path", source))["size"] == source.stat().st_size
                    assert (await db.put_object(b, "k/aiter", chunks()))["size"] == 4
                    assert await db.get_object(b, "k/aiter") == b"abcd"
                    out = tmp_path / "out.bin"
                    assert await db.get_object(b, "k/path", into=out) == source.stat().st_size
                    assert out.read_bytes() == source.read_bytes()
                    assert len(await db.list_objects(b, "k/")) == 3
                    await db.delete_object(b, "k/bytes")
                    with pytest.raises(NotFoundError):
                        await db.get_object(b, "k/bytes")

    asyncio.run(main())


def _lockctl(lockd_url: str, *args: str, stdin: bytes | None = None):
    return run_program([str(VENV_BIN / "lockctl"), "--url", lockd_url, *args], input=stdin,
                       timeout=60)


def test_lockctl_object_put_get_ls(shared_lockd, objects_proxy, tmp_path: Path):
    import json

    b = _bucket()
    source = tmp_path / "report.csv"
    source.write_bytes(b"a,b\n1,2\n")
    put = _lockctl(shared_lockd.url, "--json", "object", "put", b, "2026/report.csv",
                   str(source), "--proxy", objects_proxy, "--content-type", "text/csv")
    assert put.returncode == 0, put.stderr
    made = json.loads(put.stdout)
    assert made["size"] == 8 and made["lock"] == b and made["version"] == 1
    piped = _lockctl(shared_lockd.url, "object", "put", b, "from-stdin", "-", "--proxy",
                     objects_proxy, stdin=b"piped")
    assert piped.returncode == 0, piped.stderr
    got = _lockctl(shared_lockd.url, "object", "get", b, "2026/report.csv", "--proxy",
                   objects_proxy)
    assert got.returncode == 0 and got.stdout == source.read_bytes()
    into = tmp_path / "copy.csv"
    assert _lockctl(shared_lockd.url, "object", "get", b, "from-stdin", str(into), "--proxy",
                    objects_proxy).returncode == 0
    assert into.read_bytes() == b"piped"
    listed = _lockctl(shared_lockd.url, "--json", "object", "ls", b, "--proxy", objects_proxy)
    assert [i["key"] for i in json.loads(listed.stdout)["items"]] == ["2026/report.csv",
                                                                      "from-stdin"]
    missing = _lockctl(shared_lockd.url, "object", "get", b, "nope", "--proxy", objects_proxy)
    assert missing.returncode == 1 and b"no object" in missing.stderr, missing.stderr
    with LockClient(shared_lockd.url) as client:  # the lock is released after put
        assert not client.status(b).held


def test_put_object_sends_an_idempotency_key_unless_told_not_to(shared_lockd, objects_proxy):
    """Every PUT carries a new Idempotency-Key (resent with it after a lost answer);
    ``idempotent=False`` sends none (and so is never resent), sync and async alike."""
    b = _bucket()
    sent: list[str | None] = []

    def seen(request) -> None:
        if request.method == "PUT":
            sent.append(request.headers.get("idempotency-key"))

    async def seen_async(request) -> None:
        seen(request)

    with LockClient(shared_lockd.url) as client, client.lock(b, ttl=10) as lease, \
            FencedSession(objects_proxy, lease) as db:
        db._http.event_hooks["request"].append(seen)
        db.put_object(b, "k", b"one")
        assert db.put_object(b, "k", b"two", idempotent=False)["version"] == 2

        async def main() -> None:
            async with AsyncFencedSession(objects_proxy, lease) as adb:
                adb._http.event_hooks["request"].append(seen_async)
                await adb.put_object(b, "k", b"three")
                assert (await adb.put_object(b, "k", b"four", idempotent=False))["version"] == 4

        asyncio.run(main())
        assert db.get_object(b, "k") == b"four"
    assert [key is not None for key in sent] == [True, False, True, False]
    assert len({sent[0], sent[2]}) == 2  # a new key per call
