"""The etcd store: ``etcd://host:port,host:port,…[/prefix][?timeout=2.5]`` (etcd v3, Raft).

``store`` (``EtcdStore``: its parts and the protocol's core), ``locks`` (``modes``: holders of
either mode; ``multi``: multi-lock leases), ``semaphores``, ``elections``; the parts: ``url``
(URL and TLS), ``gateway`` (the lean HTTP client), ``transport`` (retries and failover),
``wire`` (encoding and key layout), ``leases``, ``cache`` (the lease cache), ``watch``. The
design: docs/stores/etcd.md.
"""

from lockd.server.store.etcd.cache import DEFAULT_SIZE, CachedLease, LeaseCache
from lockd.server.store.etcd.gateway import GatewayError, GatewayPool
from lockd.server.store.etcd.store import EtcdStore
from lockd.server.store.etcd.url import (
    DEFAULT_PREFIX,
    DEFAULT_TIMEOUT_S,
    cache_size,
    etcd_tls,
    parse_etcd_url,
)

__all__ = ["DEFAULT_PREFIX", "DEFAULT_SIZE", "DEFAULT_TIMEOUT_S", "CachedLease", "EtcdStore",
           "GatewayError", "GatewayPool", "LeaseCache", "cache_size", "etcd_tls",
           "parse_etcd_url"]
