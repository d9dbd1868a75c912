"""Section 7's memory per queued waiter is counted from a lockd that has already served a warm-up
round of waiters, so lockd's one-time first-use costs (the store's pool, caches, lazily built
validators) are not charged to each waiter; the figure from the fresh lockd is kept beside it.
"""

from __future__ import annotations

from bench import capacity
from bench.scenarios import Bench, Settings


def test_section_7_reads_idle_memory_after_a_warm_up_round(monkeypatch) -> None:
    events: list[tuple[str, object]] = []
    real_rss, real_run = capacity.rss_mb, capacity.loadgen.run

    def rss(pid: int) -> float:
        value = real_rss(pid)
        events.append(("rss", value))
        return value

    def run(kind: str, spec: dict, timeout: float = 600) -> dict:
        result = real_run(kind, spec, timeout)
        events.append((kind, spec["waiters"]))
        return result

    monkeypatch.setattr(capacity, "rss_mb", rss)
    monkeypatch.setattr(capacity.loadgen, "run", run)
    bench = Bench(Settings(load_waiters=30, load_locks=3))
    try:
        section = capacity.load(bench, "sqlite")
    finally:
        bench.ws.close()

    data = section.data
    assert data["served"] == 30 and data["errors"] == 0 and data["fifo"]
    warm = events.index(("queue_load", capacity._WARM_WAITERS))
    readings = [value for kind, value in events if kind == "rss"]
    before = [value for kind, value in events[:warm] if kind == "rss"]
    assert data["rss_fresh_mb"] == before[-1]
    # the idle baseline is the first reading after the warm-up round, then the queued one
    assert data["rss_idle_mb"] == readings[len(before)]
    assert data["bytes_per_waiter"] == (
        (data["rss_queued_mb"] - data["rss_idle_mb"]) * 2**20 / 30)
    assert data["bytes_per_waiter_from_fresh"] == (
        (data["rss_queued_mb"] - data["rss_fresh_mb"]) * 2**20 / 30)
    labels = [row[0] for row in section.rows]
    assert "lockd RSS fresh, MiB" in labels
    assert f"lockd RSS idle after {capacity._WARM_WAITERS} waiters served, MiB" in labels
