"""Sections 6 and 7: how many leases one lockd holds (``scale``) and what thousands of queued
waiters cost it (``load``). ``bench.scenarios`` registers them."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import psycopg

from bench import loadgen
from bench.peers import rss_mb
from bench.report import Section, fmt, pct, ratio
from bench.waiter_memory import WARM_WAITERS

if TYPE_CHECKING:
    from bench.scenarios import Bench

__all__ = ["load", "scale"]


def scale(bench: Bench, store: str = "postgres") -> Section:
    s = bench.settings
    # One anonymous identity holds every lease here: lift its lease limit (100,000 by default)
    # above the held leases plus the probes'.
    server = bench.ws.lockd(store, f"lockd-scale-{store}",
                            args=("--max-leases-per-identity", str(s.scale_leases + 10_000)))
    addr = server.addr()
    idle = rss_mb(server.pid)
    small = 100
    fill_s = []
    res = loadgen.run("fill", {**addr, "prefix": "bench6/held", "count": small})
    fill_s.append(res["seconds"])
    time.sleep(0.5)
    rss_small = rss_mb(server.pid)
    probe_small = loadgen.run("probe", {**addr, "prefix": "bench6/p100", "samples": 300})
    big = s.scale_leases
    res = loadgen.run("fill", {**addr, "prefix": "bench6/held", "start": small,
                               "count": big - small, "connections": 32}, timeout=1800)
    fill_s.append(res["seconds"])
    errors = res["errors"]
    time.sleep(0.5)
    rss_big = rss_mb(server.pid)
    probe_big = loadgen.run("probe", {**addr, "prefix": "bench6/pbig", "samples": 300})
    store_mb = None
    if store == "postgres":
        dsn = server.extra["store"].replace("postgresql+psycopg://", "postgresql://", 1)
        with psycopg.connect(dsn) as conn:
            store_mb = conn.execute(
                "SELECT pg_total_relation_size('lockd.locks')").fetchone()[0] / 2**20
            held = conn.execute("SELECT count(*) FROM lockd.locks WHERE expires_at > now()"
                                " AND name LIKE 'bench6/held/%'").fetchone()[0]
    else:
        held = None
    per_lease = (rss_big - rss_small) * 2**20 / (big - small)
    section = Section(
        "6", f"Scale: lockd ({store}) holding {big:,} leases",
        f"the same lockd process holding {small} leases",
        [("figure", "str"), (f"at {small}", "num"), (f"at {big:,}", "num"), ("×", "x")])
    a50, b50 = pct(probe_small["acquire_ms"], 50), pct(probe_big["acquire_ms"], 50)
    a99, b99 = pct(probe_small["acquire_ms"], 99), pct(probe_big["acquire_ms"], 99)
    section.rows += [
        ["lockd resident memory, MiB", rss_small, rss_big, ratio(rss_big, rss_small)],
        ["acquire latency p50, ms (1 client)", a50, b50, ratio(b50, a50)],
        ["acquire latency p99, ms (1 client)", a99, b99, ratio(b99, a99)],
    ]
    section.notes.append(f"Memory per held lease in lockd: {per_lease:.0f} bytes "
                         f"((RSS at {big:,} − RSS at {small}) / {big - small:,}); idle lockd "
                         f"{idle:.1f} MiB. Leases live in the store, not in lockd's memory.")
    if store_mb is not None:
        section.notes.append(f"PostgreSQL table lockd.locks with its index: {store_mb:.1f} MiB "
                             f"({store_mb * 2**20 / big:.0f} bytes a lock); {held:,} leases "
                             "live at the end.")
    section.notes.append(f"Filling took {sum(fill_s):.1f} s ({(big - small) / fill_s[-1]:,.0f} "
                         f"acquires/s over 32 connections), {errors} errors.")
    section.data = {"rss_idle_mb": idle, "rss_small_mb": rss_small, "rss_big_mb": rss_big,
                    "bytes_per_lease": per_lease, "store_mb": store_mb, "fill_s": fill_s,
                    "errors": errors, "acquire_ms_small": [a50, a99],
                    "acquire_ms_big": [b50, b99]}
    server.stop()
    return section


# --- 7. load -----------------------------------------------------------------------------------

_WARM_WAITERS = WARM_WAITERS  # the warm-up round, as ``bench.waiter_memory`` runs it


def load(bench: Bench, store: str = "postgres", baseline: Section | None = None) -> Section:
    s = bench.settings
    # Every waiter has its own connection, plus the admin one: above lockd's default cap of
    # 1,000 open connections the last waiter would be refused with 503 (and counted an error).
    server = bench.ws.lockd(store, f"lockd-load-{store}",
                            env={"LOCKD_MAX_CONNECTIONS": str(s.load_waiters + 64)})
    fresh = rss_mb(server.pid)
    mgr = loadgen.manager()
    # A first round of waiters queued and served pays lockd's one-time costs (the store pool's
    # connections, caches, lazily built validators), so the per-waiter figure is what a waiter
    # holds, not what lockd allocates once.
    loadgen.run("queue_load", {
        **server.addr(), "prefix": "bench7warm", "locks": s.load_locks,
        "waiters": _WARM_WAITERS, "hold_ms": 2, "queued": mgr.Event()})
    idle = rss_mb(server.pid)
    queued = mgr.Event()
    proc, out = loadgen.start_job("queue_load", {
        **server.addr(), "prefix": "bench7", "locks": s.load_locks, "waiters": s.load_waiters,
        "hold_ms": 2, "queued": queued})
    peak = idle
    while not queued.is_set():
        if proc.exitcode is not None:
            break
        peak = max(peak, rss_mb(server.pid))
        time.sleep(0.2)
    queued_rss = rss_mb(server.pid)
    res = loadgen._get(out, [proc], 600)
    proc.join(10)
    if "fatal" in res:
        raise RuntimeError(res["fatal"])
    after = rss_mb(server.pid)
    p50, p99 = pct(res["handoffs_ms"], 50), pct(res["handoffs_ms"], 99)
    base = None
    label = {"postgres": "lockd · PostgreSQL", "sqlite": "lockd · SQLite"}.get(store)
    if baseline is not None and label in baseline.data:
        base = baseline.data[label]["p99_ms"]
    section = Section(
        "7", f"Load: {s.load_waiters:,} waiting acquires over {s.load_locks} locks, lockd "
             f"({store})",
        f"memory: the same lockd idle after a warm-up round; handoff: {label} with 16 "
        "waiters (section 2)",
        [("figure", "str"), ("value", "str"), ("×", "x")])
    section.rows += [
        ["served in first-come order per lock", "yes" if res["fifo"] else "NO", None],
        ["waiters served", fmt(res["served"], "int"), None],
        ["errors / dropped connections", fmt(res["errors"], "int"), None],
        ["lockd RSS fresh, MiB", fmt(fresh, "mb"), None],
        [f"lockd RSS idle after {_WARM_WAITERS} waiters served, MiB", fmt(idle, "mb"),
         ratio(idle, fresh)],
        [f"lockd RSS with {s.load_waiters:,} queued, MiB", fmt(queued_rss, "mb"),
         ratio(queued_rss, idle)],
        ["lockd RSS after, MiB", fmt(after, "mb"), ratio(after, idle)],
        ["handoff p50 ms", fmt(p50, "ms"), None],
        ["handoff p99 ms", fmt(p99, "ms"), ratio(p99, base)],
        ["seconds to serve everyone", fmt(res["serve_s"], "num"), None],
    ]
    section.data = {k: v for k, v in res.items() if k != "handoffs_ms"}
    section.data.update({"rss_fresh_mb": fresh, "rss_idle_mb": idle, "rss_queued_mb": queued_rss,
                         "rss_after_mb": after,
                         "rss_peak_while_queueing_mb": max(peak, queued_rss),
                         "handoff_p50_ms": p50, "handoff_p99_ms": p99,
                         "bytes_per_waiter": (queued_rss - idle) * 2**20 / s.load_waiters,
                         "bytes_per_waiter_from_fresh":
                             (queued_rss - fresh) * 2**20 / s.load_waiters})
    section.notes.append(
        "Each waiter has its own connection and is confirmed queued (GET shows the waiter "
        "count) before the next is sent, so the arrival order is known; each holds its grant "
        f"2 ms. Memory per queued waiter: {section.data['bytes_per_waiter']:.0f} bytes "
        f"((RSS queued − RSS idle after the warm-up) / {s.load_waiters:,}); counted from the "
        f"fresh lockd instead, with its one-time first-use costs: "
        f"{section.data['bytes_per_waiter_from_fresh']:.0f} bytes. `python -m "
        "bench.waiter_memory` shows where a waiter's bytes go.")
    if res.get("first_error"):
        section.notes.append(f"first error: {res['first_error']}")
    mgr.shutdown()
    server.stop()
    return section
