"""``resource-proxy serve --workers N``: N worker processes serving one listening socket.

The machinery (``SO_REUSEPORT`` sockets, fork before any event loop, ``PR_SET_PDEATHSIG``,
fail-stop supervision) is ``lockd.common.workers``, shared with ``lockd serve --workers``; this
module re-exports it and says what it means for the proxy.

Why for the proxy: its request work (HTTP parsing, routing, a new token's Ed25519 verification)
is CPU-bound, and it keeps no state between requests that the database does not hold (fence
rows, Idempotency-Key records), so N processes behave as N proxies on one port. The fence check
stays in the database transaction, as for several proxies. Each worker builds its own app: it
reflects the tables, opens its own pool (``pool_size`` connections each: N × ``pool_size`` in
all) and loads the JWKS itself.

Per worker, not per proxy: ``/metrics`` and ``/v1/activity`` describe the worker that answered
the request (each has its own counters); sum them over scrapes or run ``--workers 1`` when a
single view matters. ``/healthz`` is answered by whichever worker accepts it.
"""

from __future__ import annotations

from lockd.common.workers import default_workers, listening_sockets, run_workers

__all__ = ["default_workers", "listening_sockets", "run_workers"]
