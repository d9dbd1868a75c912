"""lockd's Prometheus metrics, one ``CollectorRegistry`` per app (no process-global state).

Every series is per lockd process; sum over replicas. No label carries a lock name (bounded
cardinality: labels are small fixed enums, and ``identity``: the names of the configured
identities, or key ids of configured keys, or ``anonymous``).

=======================================  =========  ================================================
metric                                   type       meaning
=======================================  =========  ================================================
``lockd_leases_active``                  gauge      leases this process granted or renewed and
                                                    believes live (released/expired ones leave)
``lockd_acquires_waiting``               gauge      acquires queued at this process, all locks
``lockd_holders{mode}``                  gauge      lock leases granted or renewed here and
                                                    believed live, ``exclusive`` / ``shared``
``lockd_permits_active``                 gauge      semaphore permits granted or renewed here and
                                                    believed live
``lockd_waiters{mode}``                  gauge      requests queued here: ``exclusive``,
                                                    ``shared`` (every lock of the set shared),
                                                    ``permit`` (semaphores)
``lockd_acquires_total{outcome}``        counter    ``granted``, ``held`` (409), ``error``
``lockd_acquire_wait_seconds{outcome}``  histogram  time from request to answer of an acquire
``lockd_lease_ttl_seconds``              histogram  TTL granted (compare with the hold time)
``lockd_lease_hold_seconds{outcome}``    histogram  grant to ``released`` / ``expired`` /
                                                    ``forced`` (force-release)
``lockd_renewals_total{outcome}``        counter    ``ok``, ``lease_lost`` (410), ``error``
``lockd_renewal_failures_total{reason}`` counter    ``lease_lost``, ``store_unavailable``
``lockd_renewal_margin_seconds``         histogram  lease time left when a renewal arrived
``lockd_renewal_margin_ratio``           histogram  the same, as a fraction of the lease's TTL
``lockd_lease_expirations_total``        counter    leases that lapsed without a release
                                                    (crashed or frozen holders); see ``observe``
``lockd_releases_total{kind}``           counter    ``released`` (by the holder), ``forced``
``lockd_handoffs_total``                 counter    grants of a lock that had refused a contender
                                                    since its previous grant
``lockd_store_clock_skew_seconds``       gauge      store clock minus lockd clock (SQLite: 0)
``lockd_store_clock_skew_errors_total``  counter    skew samples that failed
``lockd_event_streams``                  gauge      open ``/events`` streams
``lockd_events_dropped_total``           counter    event streams dropped: their client lagged
``lockd_auth_failures_total{reason}``    counter    ``missing`` / ``wrong`` key, ``forbidden``,
                                                    ``forbidden_lock`` (outside the scope)
``lockd_identity_limited_total``         counter    429s of an identity at its limit;
``{identity, limit}``                               ``limit``: ``leases`` / ``waiters`` /
                                                    ``streams`` (its share of event streams)
``lockd_election_leader_changes_total``  counter    new leaders elected here (a new term each)
``lockd_election_term_seconds``          histogram  a term from election to resignation here
                                                    (or to the next election here, if it lapsed)
``lockd_election_handovers_total``       counter    handovers requested here
=======================================  =========  ================================================
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["LockdMetrics", "CONTENT_TYPE_LATEST"]

WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
LEASE_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
MARGIN_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)
RATIO_BUCKETS = (0.05, 0.1, 0.2, 0.33, 0.5, 0.67, 0.8, 0.9, 1.0)


class LockdMetrics:
    """The metric objects of one lockd app; ``render()`` is the ``/metrics`` body."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.leases_active = Gauge("lockd_leases_active",
                                   "Leases granted or renewed here and believed live.",
                                   registry=r)
        self.acquires_waiting = Gauge("lockd_acquires_waiting",
                                      "Acquires queued at this lockd process.", registry=r)
        self.holders = Gauge("lockd_holders", "Lock leases granted or renewed here and believed "
                             "live, by mode.", ["mode"], registry=r)
        self.permits_active = Gauge("lockd_permits_active", "Semaphore permits granted or "
                                    "renewed here and believed live.", registry=r)
        self.waiters = Gauge("lockd_waiters", "Requests queued at this lockd process, by mode "
                             "(exclusive, shared, permit).", ["mode"], registry=r)
        acquires = Counter("lockd_acquires", "Acquire requests answered, by outcome.",
                           ["outcome"], registry=r)
        wait = Histogram("lockd_acquire_wait_seconds",
                         "Time from an acquire request to its answer.", ["outcome"],
                         buckets=WAIT_BUCKETS, registry=r)
        self.acquire_outcomes = {o: (acquires.labels(o), wait.labels(o))
                                 for o in ("granted", "held", "error")}
        self.lease_ttl = Histogram("lockd_lease_ttl_seconds", "TTL of granted leases.",
                                   buckets=LEASE_BUCKETS, registry=r)
        hold = Histogram("lockd_lease_hold_seconds",
                         "Time from grant to release, expiry or force-release.", ["outcome"],
                         buckets=LEASE_BUCKETS, registry=r)
        self.hold = {o: hold.labels(o) for o in ("released", "expired", "forced")}
        renewals = Counter("lockd_renewals", "Renew requests answered, by outcome.", ["outcome"],
                           registry=r)
        self.renewals = {o: renewals.labels(o) for o in ("ok", "lease_lost", "error")}
        failures = Counter("lockd_renewal_failures",
                           "Renewals that failed: the lease was gone, or the store did not answer.",
                           ["reason"], registry=r)
        self.renewal_failures = {o: failures.labels(o)
                                 for o in ("lease_lost", "store_unavailable")}
        self.renewal_margin = Histogram(
            "lockd_renewal_margin_seconds",
            "Lease time left when a renewal arrived (small: TTLs are too short).",
            buckets=MARGIN_BUCKETS, registry=r)
        self.renewal_margin_ratio = Histogram(
            "lockd_renewal_margin_ratio",
            "Lease time left when a renewal arrived, as a fraction of its TTL.",
            buckets=RATIO_BUCKETS, registry=r)
        self.expirations = Counter("lockd_lease_expirations",
                                   "Leases that lapsed without a release (crashed or frozen "
                                   "holders).", registry=r)
        releases = Counter("lockd_releases", "Leases ended by their holder or by an operator.",
                           ["kind"], registry=r)
        self.releases = {k: releases.labels(k) for k in ("released", "forced")}
        self.handoffs = Counter("lockd_handoffs",
                                "Grants of a lock that had refused a contender since its "
                                "previous grant.", registry=r)
        self.skew = Gauge("lockd_store_clock_skew_seconds",
                          "The store's clock minus lockd's, last sample.", registry=r)
        self.skew_errors = Counter("lockd_store_clock_skew_errors",
                                   "Clock skew samples that failed.", registry=r)
        self.event_streams = Gauge("lockd_event_streams", "Open event streams.", registry=r)
        self.events_dropped = Counter("lockd_events_dropped",
                                      "Event streams dropped because their client fell too far behind.",
                                      registry=r)
        auth = Counter("lockd_auth_failures", "Requests refused for their API key.", ["reason"],
                       registry=r)
        self.auth_failures = {k: auth.labels(k)
                              for k in ("missing", "wrong", "forbidden", "forbidden_lock")}
        self.identity_limited = Counter(
            "lockd_identity_limited", "Requests refused (429) because their identity was at its "
            "limit of live leases or queued waiters.", ["identity", "limit"], registry=r)
        self.election_leader_changes = Counter(
            "lockd_election_leader_changes", "New leaders elected at this lockd.", registry=r)
        self.election_term = Histogram(
            "lockd_election_term_seconds", "Length of leaders' terms (election to resignation, "
            "or to the next election when a term lapsed).", buckets=LEASE_BUCKETS, registry=r)
        self.election_handovers = Counter(
            "lockd_election_handovers", "Handovers requested at this lockd.", registry=r)

    def watch(self, *, leases_active: Callable[[], float],
              acquires_waiting: Callable[[], float]) -> None:
        """Compute the two gauges at scrape time (nothing to update on the hot path)."""
        self.leases_active.set_function(leases_active)
        self.acquires_waiting.set_function(acquires_waiting)

    def watch_modes(self, *, holders: Callable[[str], float], permits: Callable[[], float],
                    waiters: Callable[[], dict[str, int]]) -> None:
        """Compute the per-mode gauges at scrape time: ``holders(mode)`` for ``exclusive`` and
        ``shared``, ``permits()``, and ``waiters()`` (mode -> count)."""
        for mode in ("exclusive", "shared"):
            self.holders.labels(mode).set_function(lambda mode=mode: holders(mode))
        self.permits_active.set_function(permits)
        for mode in ("exclusive", "shared", "permit"):
            self.waiters.labels(mode).set_function(lambda mode=mode: waiters().get(mode, 0))

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
