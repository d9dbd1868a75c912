"""Where object bodies are stored: the blob store stores, the proxy's database decides.

A blob is written ONCE under a new, generated name (128 random bits, never derived from the
object's key) and made durable before the database may point at it; it is never rewritten,
only deleted (a stale or replaced version, an orphan). So no write of the blob store needs a
compare-and-swap of its own, and no key can name a path.

``DirectoryBlobs`` (``--objects-dir DIR``, the embedded default) lays out::

    DIR/tmp/<name>            a body being received (created O_EXCL, mode 0600)
    DIR/blobs/<ab>/<name>     a complete blob: written, fsync'ed, renamed here, its directory
                              fsync'ed (the rename is durable before the pointer moves)

Files are opened with ``O_NOFOLLOW``: a symlink planted in DIR is never followed. The body
is streamed: at most ``chunk`` bytes (1 MiB) are buffered per request, written from a worker
thread so the event loop never waits on the disk. ``S3Blobs`` (``objects.s3``) is the other
backend, with the same calls.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from resource_proxy.errors import BlobStoreUnavailable, PayloadTooLarge

__all__ = ["Stored", "BlobMissing", "BlobStore", "DirectoryBlobs", "new_name", "CHUNK"]

CHUNK = 1 << 20  # bytes buffered per request before a write
READ_CHUNK = 256 * 1024
_NAME_CHARS = frozenset("0123456789abcdef")


class BlobMissing(Exception):
    """The blob is gone (a newer version replaced it after its pointer was read)."""


@dataclass(frozen=True, slots=True)
class Stored:
    """A body made durable: its blob ``name``, ``size`` (bytes) and ``sha256`` (hex)."""

    name: str
    size: int
    sha256: str


def new_name() -> str:
    """A fresh blob name: 32 hex characters (128 random bits)."""
    return secrets.token_hex(16)


def is_blob_name(name: str) -> bool:
    return len(name) == 32 and set(name) <= _NAME_CHARS


class BlobStore(Protocol):
    """What the object service needs of a blob backend."""

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def put(self, chunks: AsyncIterator[bytes], limit: int) -> Stored:
        """Store the stream under a new name, durably; ``PayloadTooLarge`` (nothing kept) past
        ``limit`` bytes."""

    def read(self, name: str, start: int, end: int) -> AsyncIterator[bytes]:
        """Bytes ``start`` to ``end`` (exclusive) of a blob; ``BlobMissing`` if it is gone."""

    async def delete(self, name: str) -> None:
        """Remove a blob (no error if it is gone)."""

    async def older_than(self, age_s: float) -> list[str]:
        """Names of the complete blobs last written more than ``age_s`` ago; unfinished
        uploads that old are removed on the way (their request is long dead)."""


class DirectoryBlobs:
    """Blobs as files under ``root`` (created if missing)."""

    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()
        self.tmp = self.root / "tmp"
        self.blobs = self.root / "blobs"

    async def open(self) -> None:
        def prepare() -> None:
            for directory in (self.root, self.tmp, self.blobs):
                directory.mkdir(mode=0o700, parents=True, exist_ok=True)
                if directory.is_symlink():
                    raise ValueError(f"{directory} is a symlink")

        await asyncio.to_thread(prepare)

    async def close(self) -> None:
        return None

    def path_of(self, name: str) -> Path:
        if not is_blob_name(name):  # only names this module made: never a path from outside
            raise BlobMissing(name)
        return self.blobs / name[:2] / name

    async def put(self, chunks: AsyncIterator[bytes], limit: int) -> Stored:
        try:
            return await self._put(chunks, limit)
        except OSError as exc:  # disk full, I/O error, a directory removed under us
            raise BlobStoreUnavailable(f"the objects' directory failed: {exc.strerror or exc}; "
                                       "nothing was stored (retry later)") from None

    async def _put(self, chunks: AsyncIterator[bytes], limit: int) -> Stored:
        name = new_name()
        temp = self.tmp / name
        fd = await asyncio.to_thread(
            os.open, temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        digest = hashlib.sha256()
        size = 0
        buffer = bytearray()
        done = False
        open_fd: int | None = fd
        try:
            async for chunk in chunks:
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(f"the object exceeds the largest this proxy stores "
                                          f"({limit} bytes)", limit=limit)
                digest.update(chunk)
                buffer += chunk
                if len(buffer) >= CHUNK:
                    data, buffer = bytes(buffer), bytearray()
                    await asyncio.to_thread(_write_all, fd, data)
            open_fd = None  # _finish closes it, whatever happens
            await asyncio.to_thread(self._finish, fd, bytes(buffer), temp, name)
            done = True
        finally:
            if not done:
                await asyncio.to_thread(_discard, open_fd, temp)
        return Stored(name, size, digest.hexdigest())

    def _finish(self, fd: int, rest: bytes, temp: Path, name: str) -> None:
        """Write the rest, fsync, close, rename into ``blobs/<ab>/``, fsync that directory."""
        try:
            _write_all(fd, rest)
            os.fsync(fd)
        finally:
            os.close(fd)
        shard = self.blobs / name[:2]
        if not shard.is_dir():
            shard.mkdir(mode=0o700, exist_ok=True)
            _fsync_dir(self.blobs)
        os.rename(temp, shard / name)
        _fsync_dir(shard)

    async def read(self, name: str, start: int, end: int) -> AsyncIterator[bytes]:  # type: ignore[override]
        path = self.path_of(name)
        try:
            fd = await asyncio.to_thread(os.open, path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise BlobMissing(name) from None
        except OSError as exc:
            raise BlobStoreUnavailable(f"the objects' directory failed: {exc.strerror or exc}")\
                from None
        try:
            position = start
            while position < end:
                data = await asyncio.to_thread(os.pread, fd, min(READ_CHUNK, end - position),
                                               position)
                if not data:
                    return
                position += len(data)
                yield data
        finally:
            os.close(fd)

    async def delete(self, name: str) -> None:
        try:
            path = self.path_of(name)
        except BlobMissing:
            return
        await asyncio.to_thread(_unlink, path)

    async def older_than(self, age_s: float) -> list[str]:
        def scan() -> list[str]:
            cutoff = time.time() - age_s
            for entry in os.scandir(self.tmp):
                if _mtime(entry) < cutoff:
                    _unlink(Path(entry.path))
            found = []
            for shard in os.scandir(self.blobs):
                if not shard.is_dir(follow_symlinks=False):
                    continue
                for entry in os.scandir(shard.path):
                    if is_blob_name(entry.name) and _mtime(entry) < cutoff:
                        found.append(entry.name)
            return found

        return await asyncio.to_thread(scan)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _discard(fd: int | None, temp: Path) -> None:
    if fd is not None:
        os.close(fd)
    _unlink(temp)


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _mtime(entry: os.DirEntry) -> float:
    try:
        return entry.stat(follow_symlinks=False).st_mtime
    except FileNotFoundError:
        return float("inf")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
