"""The proxy's Prometheus metrics (prometheus-client), one ``CollectorRegistry`` per app.

Labels are small fixed enums (``call``, ``op``, ``outcome``, HTTP ``status``); never a lock,
table or key, so cardinality stays bounded however many locks write through the proxy.

===========================================  =========  =========================================
metric                                       type       meaning
===========================================  =========  =========================================
``resource_proxy_requests_total{call,status}``  counter  every answer, by call and HTTP status
``resource_proxy_writes_total{op,outcome}``  counter    fenced writes (insert, upsert, update,
                                                        delete, batch, claim) by outcome: ``ok``,
                                                        ``stale``, ``token_required``,
                                                        ``invalid_token``, ``forbidden`` (also
                                                        a shared token's write),
                                                        ``not_found``, ``conflict``, ``invalid``,
                                                        ``unavailable``, ``unknown`` (outcome
                                                        unknown), ``error``
``resource_proxy_write_seconds{op}``         histogram  time from request to answer of a write
``resource_proxy_stale_rejections_total{call}``  counter  409 ``stale_token`` (writes, claims,
                                                        fenced reads)
``resource_proxy_fence_lag``                 histogram  highest minus presented fence of a stale
                                                        rejection (how far behind the holder was)
``resource_proxy_jwks_loads_total``          counter    JWKS (re)loads attempted
``resource_proxy_auth_failures_total{reason}``  counter  API key ``missing`` / ``wrong``
``resource_proxy_object_blob_deletes_pending``  gauge   replaced objects' blobs whose delete
                                                        (after the answer) has not finished
===========================================  =========  =========================================
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

__all__ = ["ProxyMetrics", "CONTENT_TYPE_LATEST", "WRITE_CALLS", "OUTCOMES"]

WRITE_CALLS = ("insert", "upsert", "update", "delete", "batch", "claim")
OUTCOMES = {
    "stale_token": "stale", "token_required": "token_required", "invalid_token": "invalid_token",
    "lock_not_allowed": "forbidden", "shared_token": "forbidden", "not_found": "not_found",
    "conflict": "conflict",
    "invalid_request": "invalid", "payload_too_large": "invalid",
    "database_unavailable": "unavailable", "lock_timeout": "unavailable",
    "outcome_unknown": "unknown",
    "idempotency_key_reused": "invalid",
}
WRITE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
LAG_BUCKETS = (1, 2, 3, 5, 10, 20, 50, 100, 1000, 10_000, 100_000)


class _JwksLoads(Collector):
    def __init__(self, loads: Callable[[], int]):
        self._loads = loads

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily("resource_proxy_jwks_loads", "JWKS (re)loads attempted.",
                                  value=self._loads())


class _Pending(Collector):
    def __init__(self, pending: Callable[[], int]):
        self._pending = pending

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("resource_proxy_object_blob_deletes_pending",
                                "Replaced objects' blobs still being deleted after the answer.",
                                value=self._pending())


class ProxyMetrics:
    """The metric objects of one proxy app; ``render()`` is the ``/metrics`` body."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("resource_proxy_requests", "Requests answered, by call and status.",
                                ["call", "status"], registry=r)
        writes = Counter("resource_proxy_writes", "Fenced writes answered, by op and outcome.",
                         ["op", "outcome"], registry=r)
        self.writes = {(op, outcome): writes.labels(op, outcome)
                       for op in WRITE_CALLS for outcome in ("ok", *sorted(set(OUTCOMES.values())),
                                                             "error")}
        seconds = Histogram("resource_proxy_write_seconds", "Time from a write request to its answer.",
                            ["op"], buckets=WRITE_BUCKETS, registry=r)
        self.write_seconds = {op: seconds.labels(op) for op in WRITE_CALLS}
        stale = Counter("resource_proxy_stale_rejections",
                        "Requests refused because their fence was below the highest honoured.",
                        ["call"], registry=r)
        self.stale = {c: stale.labels(c) for c in ("insert", "upsert", "update", "delete", "batch",
                                                   "claim", "read", "list")}
        self.fence_lag = Histogram("resource_proxy_fence_lag",
                                   "Highest minus presented fence of stale rejections.",
                                   buckets=LAG_BUCKETS, registry=r)
        auth = Counter("resource_proxy_auth_failures", "Requests refused for their API key.",
                       ["reason"], registry=r)
        self.auth_failures = {k: auth.labels(k) for k in ("missing", "wrong")}

    def watch_jwks_loads(self, loads: Callable[[], int]) -> None:
        """Report ``loads()`` as ``resource_proxy_jwks_loads_total`` at scrape time."""
        self.registry.register(_JwksLoads(loads))

    def watch_blob_deletes(self, pending: Callable[[], int]) -> None:
        """Report ``pending()`` as ``resource_proxy_object_blob_deletes_pending``."""
        self.registry.register(_Pending(pending))

    def render(self) -> bytes:
        return generate_latest(self.registry)
