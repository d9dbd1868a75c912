"""``EtcdStore``: lockd's ``Store`` on an etcd v3 cluster (Raft), through etcd's JSON gateway:
the parts (transport, leases, key layout, lease cache, watches) and the core of the protocol;
the primitives are its mixins (``locks``, ``semaphores``, ``elections``). Fences are etcd
revisions, which only grow; every request may be replayed on another member and every write
recognises its own replay. The mapping onto etcd: docs/stores/etcd.md.
"""

from __future__ import annotations

from lockd.server.store.etcd.cache import LeaseCache
from lockd.server.store.etcd.elections import ElectionMethods, Elections
from lockd.server.store.etcd.leases import Leases
from lockd.server.store.etcd.locks import LockMethods
from lockd.server.store.etcd.modes import LockModes
from lockd.server.store.etcd.multi import MultiLocks
from lockd.server.store.etcd.semaphores import SemaphoreMethods, Semaphores
from lockd.server.store.etcd.transport import Transport
from lockd.server.store.etcd.url import cache_size, etcd_tls, parse_etcd_url
from lockd.server.store.etcd.watch import Watch
from lockd.server.store.etcd.wire import Keys, b64, to_int
from lockd.server.store.values import ReleaseListener

__all__ = ["EtcdStore"]


class EtcdStore(LockMethods, SemaphoreMethods, ElectionMethods):
    """``Store`` on an etcd v3 cluster. See docs/stores/etcd.md for the mapping.

    ``url``: ``etcd://host:port,host:port,…[/prefix][?timeout=seconds][&cache=entries]``
    (and TLS: ``ca``, ``cert``/``key``, ``tls=1``). ``timeout`` (seconds; default: the URL's,
    else 2.5) bounds every store call, all endpoint retries included, before
    ``StoreUnavailable``; ``cache`` sizes the lease cache (0 turns it off). Raises
    ``ValueError`` for a malformed URL.
    """

    def __init__(self, url: str, *, timeout: float | None = None):
        endpoints, prefix, url_timeout = parse_etcd_url(url)
        self._cache = LeaseCache(cache_size(url))
        self._keys = Keys(prefix)
        self._transport = Transport(endpoints, timeout if timeout is not None else url_timeout,
                                    etcd_tls(url))
        self._leases = Leases(self._transport)
        self._modes = LockModes(self._transport, self._leases, self._keys, self._cache)
        self._multi = MultiLocks(self._transport, self._leases, self._keys, self._modes)
        self._sems = Semaphores(self._transport, self._leases, self._keys, self._cache,
                                self._modes)
        self._elections = Elections(self._transport, self._leases, self._keys, self._modes)
        self._watch = Watch(self._transport, self._keys)
        self._election_watch = Watch(self._transport, self._keys, self._keys.elections,
                                     deletes_only=False)

    # -- lifecycle -----------------------------------------------------------------------

    async def open(self) -> None:
        """Connect (a linearizable read must succeed) and start the watch stream."""
        self._transport.open()
        try:
            revision = await self._ping()
        except BaseException:
            await self.close()
            raise
        self._watch.start(revision + 1)
        self._election_watch.start(revision + 1)

    async def close(self) -> None:
        """Stop the watch, finish pending revokes, close every connection; idempotent."""
        await self._leases.drain(self._transport.timeout)
        await self._watch.stop()
        await self._election_watch.stop()
        await self._transport.aclose()

    # -- small etcd calls ----------------------------------------------------------------

    async def _ping(self) -> int:
        """A linearizable read (needs a quorum); returns the store revision."""
        doc = await self._transport.post("/v3/kv/range",
                                         {"key": b64(self._keys.fences), "count_only": True})
        return to_int(doc["header"].get("revision"))

    # -- the core of the Store protocol --------------------------------------------------

    async def clock_offset(self) -> float | None:
        """etcd's wall clock (the HTTP ``Date`` header of a gateway answer, whole seconds, so
        within about ±0.5 s) minus lockd's; ``None`` if no member sends one. Informational:
        etcd expires leases on its leader's monotonic timer, so wall-clock skew moves no expiry.
        """
        return await self._transport.clock_offset()

    def subscribe(self, listener: ReleaseListener) -> None:
        """Register ``listener``; the store's watch streams call it on every delete of a holder
        or permit key and on every election write."""
        self._watch.subscribe(listener)
        self._election_watch.subscribe(listener)

    async def ping(self) -> None:
        """A linearizable read: raises ``StoreUnavailable`` without a quorum."""
        await self._ping()
