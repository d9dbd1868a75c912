"""The store's one watch stream: every release and expiry reaches the subscribed listeners.

ONE streaming watch per store on the lock-key prefix, delete events only (a release and an
expiry both delete the key). On errors it reconnects to the next member, resuming at the
revision after the last event it delivered, so no release is missed; if etcd has compacted that
revision away, it resumes from the oldest one kept and calls the listeners for every lock that
is free, so waiters whose release fell into the gap retry. See docs/stores/etcd.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httpx

from lockd.server.errors import StoreUnavailable
from lockd.server.store.etcd.transport import Transport
from lockd.server.store.etcd.wire import Keys, b64, notify_name, prefix_end, to_int, unb64
from lockd.server.store.listeners import ReleaseListeners, stop_task
from lockd.server.store.values import ReleaseListener, sem_key

__all__ = ["Watch"]

log = logging.getLogger("lockd.server.store.etcd")


class _WatchBroken(Exception):
    """The watch stream failed or ended; reconnect."""


class Watch:
    """Deletes under ``keys.locks`` → ``listener(lock name)`` for every subscribed listener.

    A key's listener name is ``notify_name`` of its part after the prefix: a shared holder's
    key ``<name>#s/…`` is ``<name>``, a permit's ``#sem/<name>#<slot>`` is ``sem_key(name)``.
    With ``prefix`` (e.g. ``keys.elections``) and ``deletes_only=False`` it watches that range
    instead, puts included (an election's writes), and calls each name once per revision.
    """

    def __init__(self, transport: Transport, keys: Keys, prefix: bytes | None = None,
                 deletes_only: bool = True):
        self._transport = transport
        self._keys = keys
        self._prefix = keys.locks if prefix is None else prefix
        self._deletes_only = deletes_only
        self._listeners = ReleaseListeners(log)
        self._task: asyncio.Task | None = None
        self._created = asyncio.Event()  # the current stream is established
        self._gap = False  # resumed after compacted history: wake every free lock
        self._resume_at = 0  # the revision the watch resumes from after a break

    def subscribe(self, listener: ReleaseListener) -> None:
        self._listeners.add(listener)

    def start(self, revision: int) -> None:
        """Start watching from ``revision`` (events at or after it are delivered); idempotent."""
        if self._task is None:
            self._created = asyncio.Event()
            self._task = asyncio.create_task(self._loop(revision), name="lockd-etcd-watch")

    async def stop(self) -> None:
        """Cancel the stream and wait for it to end; idempotent."""
        task, self._task = self._task, None
        await stop_task(task)

    async def _loop(self, start_revision: int) -> None:
        """Keep one watch stream open; deliver delete events; resume after errors."""
        locks = self._prefix
        transport = self._transport
        self._resume_at = start_revision
        index = transport.current
        failures = 0
        self._gap = False
        while True:
            endpoint = transport.endpoints[index % len(transport.endpoints)]
            request = {"create_request": {
                "key": b64(locks), "range_end": b64(prefix_end(locks)),
                "filters": ["NOPUT"] if self._deletes_only else [],
                "start_revision": str(self._resume_at),
                "progress_notify": True}}
            try:
                assert transport.http is not None
                async with transport.http.stream(
                        "POST", endpoint + "/v3/watch", json=request,
                        timeout=httpx.Timeout(None, connect=1.0)) as response:
                    if response.status_code != 200:
                        raise _WatchBroken(f"HTTP {response.status_code}")
                    async for line in response.aiter_lines():
                        if not line.strip():
                            continue
                        self._on_message(json.loads(line))
                        failures = 0
                        if self._gap and self._created.is_set():
                            self._gap = False
                            await self._notify_free_locks()
                raise _WatchBroken("stream ended")
            except asyncio.CancelledError:
                raise
            except (httpx.HTTPError, _WatchBroken, ValueError, KeyError) as exc:
                failures += 1
                index += 1
                if failures == 1 or failures % 20 == 0:
                    log.warning("etcd watch on %s broke (%s); reconnecting", endpoint, exc)
                await asyncio.sleep(min(0.05 * failures, 1.0))

    async def _names(self, prefix: bytes) -> list[str]:
        """Every key name under ``prefix`` (prefix stripped), in pages of 1000."""
        names: list[str] = []
        start, end = prefix, b64(prefix_end(prefix))
        while True:
            doc = await self._transport.post(
                "/v3/kv/range", {"key": b64(start), "range_end": end, "limit": "1000",
                                 "keys_only": True})
            kvs = doc.get("kvs") or []
            names += [unb64(kv["key"])[len(prefix):].decode() for kv in kvs]
            if not doc.get("more") or not kvs:
                return names
            start = unb64(kvs[-1]["key"]) + b"\x00"

    async def _notify_free_locks(self) -> None:
        """After a gap in the watch history (compaction): call listeners for every lock that
        is free now and every semaphore (elections stream: every election), so any waiter for
        a release we could not see retries (rare; one read of the names of all locks ever
        used)."""
        try:
            if self._prefix != self._keys.locks:  # elections: wake every one
                for name in dict.fromkeys(notify_name(n) for n in await self._names(self._prefix)):
                    self._listeners.notify(name)
                return
            fenced = await self._names(self._keys.fences)
            sems = await self._names(self._keys.sems)
            held = {notify_name(n) for n in await self._names(self._keys.locks)}
        except StoreUnavailable as exc:
            log.warning("etcd watch: could not list locks after a gap: %s", exc.detail)
            return
        for lock in fenced:
            if lock not in held:
                self._listeners.notify(lock)
        for name in sems:  # a waiter for a permit needs one free slot, not a free semaphore
            self._listeners.notify(sem_key(name))

    def _on_message(self, msg: dict[str, Any]) -> None:
        """Handle one watch message; keep ``_resume_at``, the revision to resume from."""
        if "error" in msg:
            raise _WatchBroken(str(msg["error"].get("message", msg["error"])))
        result = msg["result"]
        if result.get("created"):
            self._created.set()
        if result.get("canceled"):
            compacted = to_int(result.get("compact_revision"))
            if compacted:  # the deletes before it are gone: resume there, then wake all
                log.warning("etcd watch: revision %d compacted; resuming at %d",
                            self._resume_at, compacted)
                self._resume_at = compacted
                self._gap = True
                self._created.clear()
            raise _WatchBroken(result.get("cancel_reason") or "watch canceled")
        events = result.get("events") or []
        names: dict[str, None] = {}
        for event in events:
            kv = event.get("kv", {})
            self._resume_at = max(self._resume_at, to_int(kv.get("mod_revision")) + 1)
            if event.get("type") == "DELETE" or not self._deletes_only:
                names[notify_name(unb64(kv.get("key"))[len(self._prefix):].decode())] = None
        for name in names:
            self._listeners.notify(name)
        if not events and not result.get("created"):  # progress notification: all sent
            self._resume_at = max(self._resume_at, to_int(result["header"].get("revision")) + 1)
