"""The history checker on small hand-made histories: each failure mode is pinned, and a clean
history with every kind of outcome (ack, 409, unknown committed or not) passes."""

from __future__ import annotations

import json

from chaos.checker import HistoryRow, check, collect_ops, load_events


def op(op_id: str, fence: int, read: int | None = None, *, outcome: str = "ack",
       phase: str = "write", up: float = 100.0, granted: float = 0.0, worker: str = "w1",
       **extra) -> list[dict]:
    """The events one worker logs for one operation (``outcome`` None: killed mid-write):
    ``attempt`` and ``acquired`` at uptime ``granted`` (by default all grants overlap, so any
    fence order is possible), the rest at ``up``."""
    events = [{"ev": "attempt", "op": op_id, "w": worker, "up": granted},
              {"ev": "acquired", "op": op_id, "w": worker, "fence": fence, "up": granted}]
    if read is None:
        events.append({"ev": outcome, "op": op_id, "w": worker, "phase": phase, "up": up, **extra})
        return events
    events.append({"ev": "read", "op": op_id, "w": worker, "fence": fence, "value": read, "up": up})
    events.append({"ev": "write", "op": op_id, "w": worker, "fence": fence, "read": read,
                   "wrote": read + 1, "up": up})
    if outcome is not None:
        events.append({"ev": outcome, "op": op_id, "w": worker, "phase": phase, "fence": fence,
                       "read": read, "wrote": read + 1, "up": up + 0.1, **extra})
    return events


def row(i: int, op_id: str, fence: int, read: int, wrote: int | None = None) -> HistoryRow:
    return HistoryRow(i, op_id, "w", fence, read, read + 1 if wrote is None else wrote)


def kinds(result) -> list[str]:
    return sorted(v.kind for v in result.violations)


def test_a_clean_history_with_every_outcome_passes():
    events = (op("a", 1, 0, up=1) + op("b", 2, 1, up=2)
              # c was frozen with fence 3; d (fence 4) claimed, so c's write got 409
              + op("d", 4, 2, up=3) + op("c", 3, 2, outcome="stale", presented=3, highest=4, up=4)
              # e's write timed out but committed; f's timed out and did not; g was killed
              + op("e", 5, 3, outcome="unknown", up=5) + op("f", 6, 4, outcome="unknown", up=6)
              + op("g", 7, 4, outcome=None, up=7)
              + op("h", 8, outcome="not_acquired", phase="acquire"))
    history = [row(1, "a", 1, 0), row(2, "b", 2, 1), row(3, "d", 4, 2), row(4, "e", 5, 3)]
    result = check(history, 4, events)
    assert result.ok, result.violations
    assert result.stats == {
        "attempted": 8, "acquired": 8, "acknowledged": 3, "stale": 1, "stale_at_read": 0,
        "stale_at_write": 1, "unknown": 3, "unknown_committed": 1,
        "unavailable_but_committed": 0, "not_acquired": 1,
        "failed_before_write": 0, "rejected": 0, "interrupted": 1, "history_rows": 4,
        "counter": 4}


def test_a_decreasing_fence_is_a_violation():
    events = op("a", 1, 0) + op("b", 3, 1) + op("c", 2, 2)
    history = [row(1, "a", 1, 0), row(2, "b", 3, 1), row(3, "c", 2, 2)]
    result = check(history, 3, events)
    assert kinds(result) == ["fence_decrease"]
    assert result.violations[0].op == "c"


def test_a_lost_update_is_found_by_the_counter_and_the_read_chain():
    # b and c both read 1 (c's read was not fenced): both committed 2, one increment is lost
    events = op("a", 1, 0) + op("b", 2, 1) + op("c", 3, 1)
    history = [row(1, "a", 1, 0), row(2, "b", 2, 1), row(3, "c", 3, 1)]
    result = check(history, 2, events)
    assert kinds(result) == ["interleaving", "lost_update"]
    assert [v.op for v in result.violations if v.kind == "interleaving"] == ["c"]


def test_a_counter_that_disagrees_with_a_consistent_history_is_a_lost_update():
    events = op("a", 1, 0) + op("b", 2, 1)
    result = check([row(1, "a", 1, 0), row(2, "b", 2, 1)], 1, events)
    assert kinds(result) == ["lost_update"]


def test_an_interleaving_without_a_fence_decrease():
    # a stale holder's write (fence 1) landed between b's read and b's write (fence 2)
    events = op("b", 2, 0) + op("a", 1, 0)
    history = [row(1, "a", 1, 0), row(2, "b", 2, 0)]
    result = check(history, 1, events)
    assert kinds(result) == ["interleaving", "lost_update"]


def test_a_write_that_is_not_read_plus_one_is_a_violation():
    events = op("a", 1, 0)
    events[-1]["wrote"] = events[-2]["wrote"] = 5
    result = check([row(1, "a", 1, 0, wrote=5)], 5, events)
    assert "bad_write" in kinds(result)


def test_an_acknowledged_write_missing_from_the_history():
    events = op("a", 1, 0) + op("b", 2, 1)
    result = check([row(1, "a", 1, 0)], 1, events)
    assert kinds(result) == ["acked_missing"]
    assert result.violations[0].op == "b"


def test_an_acknowledged_write_with_other_values_in_the_history():
    events = op("a", 1, 0)
    result = check([HistoryRow(1, "a", "w", 1, 0, 1)], 1, events)
    assert result.ok
    events[-2]["read"] = events[-1]["read"] = 7  # the worker sent read=7, the row says 0
    result = check([HistoryRow(1, "a", "w", 1, 0, 1)], 1, events)
    assert kinds(result) == ["ack_mismatch"]


def test_a_rejected_write_that_committed_anyway():
    events = op("a", 1, 0) + op("b", 2, 1, outcome="stale", presented=2, highest=3, up=200) \
        + op("c", 3, outcome="rejected", phase="read")
    result = check([row(1, "a", 1, 0), row(2, "b", 2, 1)], 2, events)
    assert kinds(result) == ["rejected_committed"]


def test_a_row_no_worker_wrote_is_a_phantom():
    events = op("a", 1, 0) + op("b", 2, outcome="stale", phase="read", presented=2, highest=2)
    result = check([row(1, "a", 1, 0), row(2, "zz", 9, 1), row(3, "b", 2, 2)], 3, events)
    assert [v.op for v in result.violations if v.kind == "phantom"] == ["zz", "b"]


def test_a_409_must_name_a_higher_fence_someone_was_granted_before():
    granted = op("x", 9, 0, granted=50.0)
    cases = {
        "presented 10 >= highest 9": op("a", 10, outcome="stale", phase="read", presented=10,
                                        highest=9, up=60.0, granted=55.0),
        "the lease's fence was 4": op("b", 4, outcome="stale", phase="read", presented=3,
                                      highest=9, up=60.0),
        "no worker was granted": op("c", 5, outcome="stale", phase="read", presented=5,
                                    highest=12, up=60.0),
        "granted only at 50.00": op("d", 6, outcome="stale", phase="read", presented=6,
                                    highest=9, up=49.0),
    }
    for why, events in cases.items():
        result = check([row(1, "x", 9, 0)], 1, granted + events)
        assert kinds(result) == ["bogus_stale"], why
        assert why in result.violations[0].detail
    ok = op("e", 6, outcome="stale", phase="read", presented=6, highest=9, up=50.01)
    assert check([row(1, "x", 9, 0)], 1, granted + ok).ok


def test_a_fence_granted_twice_is_a_violation():
    events = op("a", 1, 0) + op("b", 1, 1, worker="w2")
    result = check([row(1, "a", 1, 0), row(2, "b", 1, 1)], 2, events)
    assert kinds(result) == ["fence_reused"]


def test_a_lower_fence_granted_after_a_higher_one_is_a_violation():
    # a's grant of fence 5 completed at uptime 10; b started asking at 11 and got fence 4
    events = op("a", 5, granted=10.0, outcome="not_acquired") + op("b", 4, granted=11.0,
                                                                    outcome="not_acquired")
    result = check([], 0, events)
    assert kinds(result) == ["fence_order"]
    assert result.violations[0].op == "b"
    # overlapping requests may be granted in either order
    events = op("a", 5, granted=10.0, outcome="not_acquired") + op("b", 4, granted=10.01,
                                                                    outcome="not_acquired")
    assert check([], 0, events).ok


def test_logs_load_with_a_torn_last_line(tmp_path):
    path = tmp_path / "w1.0.jsonl"
    lines = [json.dumps(e) for e in op("a", 1, 0)]
    path.write_text("\n".join(lines) + '\n{"ev": "attempt", "op": "b", "w')
    events = load_events([path])
    assert len(events) == 5
    ops = collect_ops(events)
    assert ops["a"].outcome == "ack" and ops["a"].fence == 1 and ops["a"].write == {
        "fence": 1, "read": 0, "wrote": 1, "up": 100.0}
