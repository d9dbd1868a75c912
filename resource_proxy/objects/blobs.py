"""Where object bodies are stored: the blob store stores, the proxy's database decides.

A blob is written ONCE under a new, generated name (128 random bits, never derived from the
object's key) and made durable before the database may point at it; it is never rewritten,
only deleted (a stale or replaced version, an orphan). So no write of the blob store needs a
compare-and-swap of its own, and no key can name a path.

``DirectoryBlobs`` (``--objects-dir DIR``, the embedded default) lays out::

    DIR/tmp/<name>            a body being received (created O_EXCL, mode 0600)
    DIR/blobs/<ab>/<name>     a complete blob: written, renamed here, fsync'ed, its directory
                              fsync'ed (both durable before the pointer moves)

Files are opened with ``O_NOFOLLOW``: a symlink planted in DIR is never followed. The body
is streamed in batches of ``BATCH`` bytes (512 KiB), each hashed (sha256) and written by ONE
worker-thread hop while the next is received, so at most ``CHUNK`` (1 MiB) plus one received
piece is buffered per request and the event loop neither waits on the disk nor hashes; a
batch is the received pieces themselves, written by one ``writev`` (never joined), and its
writeback to the disk is started at once (Linux ``sync_file_range``), so the final fsync waits
for the last batch only. The file is opened by its first write, so a small body costs one hop. ``stage`` returns once the
body is received (``Staged``): its fsync, rename and directory fsync run meanwhile, and the
caller waits for them (``Staged.durable``) before any pointer may name the blob.
``S3Blobs`` (``objects.s3``) is the other backend, with the same calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import hashlib
import os
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from resource_proxy.errors import BlobStoreUnavailable, PayloadTooLarge

__all__ = ["Stored", "Staged", "BlobMissing", "BlobStore", "DirectoryBlobs", "new_name",
           "CHUNK"]

CHUNK = 1 << 20  # the most of a body buffered per request (two batches in flight)
BATCH = CHUNK // 2  # bytes gathered before one worker-thread hop hashes and writes them
SMALL = 64 * 1024  # a last batch this small is hashed on the event loop (~0.1 ms at most)
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


class Staged:
    """A body received in full (``stored``: name, size, sha256) whose durability may still be
    under way: ``durable()`` waits for it (the blob written, fsync'ed, renamed, its directory
    fsync'ed; ``BlobStoreUnavailable`` if that failed) and must return before any pointer names
    the blob; ``abandon()`` waits for the work and deletes the blob (a write that did not
    commit). Lets the fence's transaction run while the disk makes the body durable."""

    def __init__(self, stored: Stored, work: Awaitable[None] | None,
                 delete: Callable[[str], Awaitable[None]]):
        self.stored = stored
        self._work = asyncio.ensure_future(work) if work is not None else None
        self._delete = delete

    async def durable(self) -> None:
        if self._work is not None:
            await asyncio.shield(self._work)  # a cancelled request still lets the disk finish

    async def abandon(self) -> None:
        if self._work is not None:
            await asyncio.gather(self._work, return_exceptions=True)
        await self._delete(self.stored.name)


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

    async def stage(self, chunks: AsyncIterator[bytes], limit: int) -> Staged:
        """As ``put``, returning once the body is received in full, its durability perhaps
        still under way (``Staged``)."""

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
        staged = await self.stage(chunks, limit)
        try:
            await staged.durable()
        except BaseException:
            await staged.abandon()  # nothing kept
            raise
        return staged.stored

    async def stage(self, chunks: AsyncIterator[bytes], limit: int) -> Staged:
        try:
            return await self._stage(chunks, limit)
        except OSError as exc:
            raise _unavailable(exc) from None

    async def _stage(self, chunks: AsyncIterator[bytes], limit: int) -> Staged:
        name = new_name()
        file = _Receiving(self.tmp / name)
        batch: list[bytes] = []
        batched = size = 0
        writing: asyncio.Future | None = None  # the previous batch, hashed and written meanwhile
        done = False
        try:
            async for chunk in chunks:
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(f"the object exceeds the largest this proxy stores "
                                          f"({limit} bytes)", limit=limit)
                batch.append(chunk)
                batched += len(chunk)
                if batched >= BATCH:
                    if writing is not None:
                        await writing
                    writing = asyncio.ensure_future(asyncio.to_thread(file.write, batch))
                    batch, batched = [], 0
            if writing is not None:
                await writing
                writing = None
            if batched > SMALL:  # hashed in the worker, not on the event loop
                await asyncio.to_thread(file.write, batch)
                batch = []
            else:
                file.hash(batch)
            done = True
        finally:
            if not done:
                if writing is not None:  # never close the file under a running write
                    await asyncio.gather(writing, return_exceptions=True)
                await asyncio.to_thread(file.discard)
        stored = Stored(name, size, file.digest.hexdigest())
        return Staged(stored, self._durable(file, batch, name), self._abandon)

    async def _durable(self, file: _Receiving, rest: list[bytes], name: str) -> None:
        try:
            await asyncio.to_thread(self._finish, file, rest, name)
        except OSError as exc:
            raise _unavailable(exc) from None

    async def _abandon(self, name: str) -> None:
        """Delete a staged blob wherever its work left it (received or renamed); a directory
        that fails here leaves it to the sweeper."""
        with contextlib.suppress(OSError):
            await asyncio.to_thread(_unlink, self.tmp / name)
            await self.delete(name)

    def _finish(self, file: _Receiving, rest: list[bytes], name: str) -> None:
        """Write the rest (already hashed), rename into ``blobs/<ab>/``, fsync the file, close
        it, fsync that directory: one worker-thread hop (a small body's only one). Renamed
        before the fsyncs, so one journal commit carries the file and its new directory entry
        (ext4: the directory's fsync then finds them flushed); nothing names the blob until
        both fsyncs returned (the pointer commits after), and a crash before leaves an orphan
        the sweeper removes, as one after the rename did."""
        try:
            file.write(rest, hashed=True)
            file.open()  # an empty body has written nothing yet
            shard = self.blobs / name[:2]
            target = shard / name
            try:
                os.rename(file.path, target)
            except FileNotFoundError:  # the shard's first blob: make it, durably
                shard.mkdir(mode=0o700, exist_ok=True)
                _fsync_dir(self.blobs)
                os.rename(file.path, target)
            os.fsync(file.fd)  # type: ignore[arg-type]
        finally:
            file.close()
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


class _Receiving:
    """A body being received into ``path``: opened (``O_EXCL``, ``O_NOFOLLOW``) by its first
    write, hashed (sha256) in the same worker thread that writes (hashlib lets go of the GIL)."""

    def __init__(self, path: Path):
        self.path = path
        self.fd: int | None = None
        self.digest = hashlib.sha256()
        self.written = 0  # bytes appended so far

    def hash(self, pieces: list[bytes]) -> None:
        for piece in pieces:
            self.digest.update(piece)

    def open(self) -> int:
        if self.fd is None:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                              0o600)
        return self.fd

    def write(self, pieces: list[bytes], hashed: bool = False) -> None:
        """Hash (unless ``hashed``) and append ``pieces`` with one ``writev`` (the received
        pieces as they are: no joining copy), then start their writeback to the disk, so the
        fsync at the end has less left to wait for."""
        if not pieces:
            return
        fd = self.open()
        if not hashed:
            self.hash(pieces)
        _writev_all(fd, pieces)
        if _START_WRITEBACK is not None:
            size = sum(len(p) for p in pieces)
            _START_WRITEBACK(fd, self.written, size, _WRITEBACK_FLAGS)
            self.written += size

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)

    def discard(self) -> None:
        self.close()
        _unlink(self.path)


def _writeback_call() -> Callable[[int, int, int, int], int] | None:
    """Linux's ``sync_file_range`` (starts writing a range to the disk without waiting; ctypes
    lets go of the GIL), or None elsewhere: then the fsync does all of it."""
    try:
        call = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    call.restype = ctypes.c_int
    return call


_START_WRITEBACK = _writeback_call()
_WRITEBACK_FLAGS = 2  # SYNC_FILE_RANGE_WRITE: start writeback, do not wait for it
_IOV_MAX = 1024


def _writev_all(fd: int, pieces: list[bytes]) -> None:
    """Write ``pieces`` in order: ``writev`` of up to ``_IOV_MAX`` at a time, a short write
    finished piece by piece."""
    for first in range(0, len(pieces), _IOV_MAX):
        group = pieces[first:first + _IOV_MAX]
        written = os.writev(fd, group)
        for piece in group:
            if written >= len(piece):
                written -= len(piece)
                continue
            view = memoryview(piece)[written:]
            written = 0
            while view:
                view = view[os.write(fd, view):]


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


def _unavailable(exc: OSError) -> BlobStoreUnavailable:
    """Disk full, I/O error, a directory removed under us: 503, nothing stored."""
    return BlobStoreUnavailable(f"the objects' directory failed: {exc.strerror or exc}; "
                                "nothing was stored (retry later)")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
