"""The history checker on small hand-made histories: each failure mode is pinned, and a clean
history with every kind of outcome (ack, 409, unknown committed or not) passes."""

from __future__ import annotations

import json

from chaos.checker import HistoryRow, check, collect_ops, load_events, revived_writes


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


# -- Stale commits, commit order by the database, lease exclusivity, blind writes ------

def ev(kind: str, op_id: str, up: float, worker: str = "w1", **fields) -> dict:
    return {"ev": kind, "op": op_id, "w": worker, "i": 0, "up": up, **fields}


def test_the_blind_spot_history_of_issue_20_is_a_stale_commit():
    """A (fence 1) reads 0 and freezes; B (fence 2) claims, reads 0 and is killed before
    writing; A wakes and its write of 1 is accepted; C (fence 3) reads 1 and writes 2. The
    read chain, the counter and the fence order are all fine: only the direct check sees that
    the proxy took fence 1 after honouring fence 2, and it blames A, not C."""
    events = [
        ev("attempt", "a", 0.0), ev("acquired", "a", 0.0, fence=1),
        ev("read", "a", 0.1, fence=1, value=0),
        ev("attempt", "b", 1.5, "w2"), ev("acquired", "b", 1.6, "w2", fence=2),
        ev("read", "b", 1.7, "w2", fence=2, value=0),  # claimed + read, then SIGKILL
        ev("write", "a", 3.0, fence=1, read=0, wrote=1),
        ev("ack", "a", 3.1, fence=1, read=0, wrote=1),
        ev("attempt", "c", 3.2, "w3"), ev("acquired", "c", 3.3, "w3", fence=3),
        ev("read", "c", 3.4, "w3", fence=3, value=1),
        ev("write", "c", 3.5, "w3", fence=3, read=1, wrote=2),
        ev("ack", "c", 3.6, "w3", fence=3, read=1, wrote=2),
    ]
    history = [row(1, "a", 1, 0), row(2, "c", 3, 1)]
    result = check(history, 2, events)
    assert kinds(result) == ["stale_commit"]
    assert result.violations[0].op == "a"
    assert "fence 2 honoured" in result.violations[0].detail
    # the same history where A's write was refused passes
    events[7] = ev("stale", "a", 3.1, fence=1, phase="write", presented=1, highest=2)
    assert check([row(2, "c", 3, 0)], 1, [e for e in events if e["op"] != "c" or e["ev"] not in
                                          ("read", "write", "ack")] + [
        ev("read", "c", 3.4, "w3", fence=3, value=0),
        ev("write", "c", 3.5, "w3", fence=3, read=0, wrote=1),
        ev("ack", "c", 3.6, "w3", fence=3, read=0, wrote=1)]).ok


def test_a_write_committed_after_the_database_recorded_a_higher_fence_is_a_stale_commit():
    """Check-then-act in the proxy: B's claim (fence 2) committed between A's fence check and
    A's write; by the clocks A sent first, but the database's commit order convicts A."""
    events = (op("a", 1, 0, up=5.0) + op("b", 2, outcome="not_acquired", phase="read"))
    fence_row = lambda i, f, seq: HistoryRow(i, "chaos/counter", "", f, 0, 0, kind="fence",  # noqa: E731
                                             seq=seq)
    committed_a = HistoryRow(3, "a", "w", 1, 0, 1, kind="counter", seq=3)
    history = [fence_row(1, 1, 1), fence_row(2, 2, 2), committed_a]
    result = check(history, 1, events)
    assert kinds(result) == ["stale_commit"]
    assert "after the database had recorded highest 2" in result.violations[0].detail
    # the commit order comes from seq, not id: the same rows stamped A-first pass
    history = [fence_row(1, 1, 1), fence_row(2, 2, 4), committed_a]
    assert check(history, 1, events).ok


def test_commit_order_is_the_database_seq_not_the_id():
    events = op("a", 1, 0) + op("b", 2, 1)
    history = [HistoryRow(1, "b", "w", 2, 1, 2, seq=2), HistoryRow(2, "a", "w", 1, 0, 1, seq=1)]
    assert check(history, 2, events).ok
    history = [HistoryRow(1, "a", "w", 1, 0, 1, seq=2), HistoryRow(2, "b", "w", 2, 1, 2, seq=1)]
    assert "fence_decrease" in kinds(check(history, 2, events))


def lease(op_id: str, fence: int, asked: float, granted: float, worker: str, *,
          renewed: tuple[float, ...] = (), released: float | None = None) -> list[dict]:
    out = [ev("attempt", op_id, asked, worker), ev("acquired", op_id, granted, worker, fence=fence)]
    out += [ev("renewed", op_id, s + 0.01, worker, fence=fence, sent=s) for s in renewed]
    if released is not None:
        out.append(ev("release", op_id, released, worker, fence=fence))
    return out + [ev("not_acquired", op_id, granted + 5, worker, phase="read")]


def test_a_grant_while_the_previous_lease_was_provably_live_is_a_lease_overlap():
    # a renewed at 10.3 (live until >= 11.3 with ttl 1); b's grant came back at 10.9
    events = lease("a", 1, 10.0, 10.05, "w1", renewed=(10.3,)) + lease("b", 2, 10.5, 10.9, "w2")
    result = check([], 0, events, ttl=1.0)
    assert kinds(result) == ["lease_overlap"]
    assert result.violations[0].op == "b"
    # no ttl given: no lease check
    assert check([], 0, events).ok
    # a grant after the provable end (within the slack, or later) is fine
    later = lease("a", 1, 10.0, 10.05, "w1", renewed=(10.3,)) + lease("b", 2, 10.5, 11.25, "w2")
    assert check([], 0, later, ttl=1.0).ok
    # a release ends the lease at the moment it was sent
    released = lease("a", 1, 10.0, 10.05, "w1", renewed=(10.3,), released=10.6) + lease(
        "b", 2, 10.5, 10.9, "w2")
    assert check([], 0, released, ttl=1.0).ok


def test_blind_mark_writes_are_checked_like_counter_writes():
    def mark(op_id: str, fence: int, up: float, via: str, outcome: str, mark_id: str | None = None,
             worker: str = "w1") -> list[dict]:
        m = mark_id or op_id
        return [ev("attempt", op_id, up - 0.2, worker), ev("acquired", op_id, up - 0.1, worker,
                                                          fence=fence),
                ev("write", op_id, up, worker, fence=fence, via=via, mark=m),
                ev(outcome, op_id, up + 0.05, worker, fence=fence, via=via, mark=m,
                   phase="write", **({"presented": fence, "highest": fence + 1}
                                     if outcome == "stale" else {}))]

    events = mark("m1", 1, 1.0, "post", "ack") + mark("m2", 2, 2.0, "delete", "ack", "m1")
    history = [HistoryRow(1, "m1", "w1", 1, 0, 0, kind="mark_ins"),
               HistoryRow(2, "m1", "w1", 1, 0, 0, kind="mark_del")]
    assert check(history, 0, events).ok
    # the delete is acknowledged but the mark is still there
    assert kinds(check(history[:1], 0, events)) == ["acked_missing"]
    # a mark refused with 409 that committed anyway, with a fence below one honoured before
    events += op("r", 4, 0, up=2.5, granted=2.4, worker="w3") + mark(
        "m3", 3, 3.0, "put", "stale", worker="w2")
    history += [row(3, "r", 4, 0), HistoryRow(4, "m3", "w2", 3, 0, 0, kind="mark_ins")]
    # (m3 also asked after r's grant and got a lower fence: fence_order)
    assert kinds(check(history, 1, events)) == ["fence_decrease", "fence_order",
                                                "rejected_committed", "stale_commit"]
    # a mark deleted by no DELETE any worker sent
    stray = [HistoryRow(1, "zz", "w9", 1, 0, 0, kind="mark_del")]
    assert kinds(check(stray, 0, [])) == ["phantom"]


def test_revived_writes_are_linked_to_the_pause_that_froze_their_writer():
    events = (lease("w1.0.3", 5, 4.0, 4.1, "w1")[:2]
              + [ev("read", "w1.0.3", 4.2, fence=5, value=3),
                 ev("write", "w1.0.3", 8.1, fence=5, read=3, wrote=4),
                 ev("stale", "w1.0.3", 8.2, fence=5, phase="write", presented=5, highest=6)]
              + lease("w1.0.4", 7, 8.3, 8.4, "w1")[:2]
              + [ev("write", "w1.0.4", 8.5, fence=7, via="post", mark="w1.0.4"),
                 ev("ack", "w1.0.4", 8.6, fence=7, via="post", mark="w1.0.4")])
    pauses = [{"worker": "w1", "incarnation": 0, "frozen_up": 4.5, "resumed_up": 8.0,
               "kind": "pause", "variant": "race"},
              {"worker": "w2", "incarnation": 0, "frozen_up": 9.0, "resumed_up": 11.0,
               "kind": "pause_grant", "variant": None}]
    out = revived_writes(events, [HistoryRow(1, "w1.0.4", "w1", 7, 0, 0, kind="mark_ins")],
                         pauses)
    assert {k: out[k] for k in ("pauses", "attempted", "refused", "committed", "unknown")} == {
        "pauses": 2, "attempted": 1, "refused": 1, "committed": 0, "unknown": 0}
    assert out["per_pause"][0]["writes"] == [{"op": "w1.0.3", "fence": 5, "outcome": "refused",
                                              "answer": "stale"}]
    assert out["per_pause"][1]["writes"] == []


def test_a_mark_deleted_by_a_later_retry_is_not_blamed_on_the_refused_delete():
    """make chaos on SQLite (seed 1403) reported rejected_committed falsely: w2's DELETE of mark
    w2.12.48 was refused (409), and w2's NEXT operation deleted the same mark with a newer fence
    and was acknowledged. The history's one mark_del row is the acknowledged delete's, not the
    refused one's. A refused delete is still flagged when no other delete of that mark could
    have committed."""
    def ev(kind: str, op_id: str, up: float, **extra) -> dict:
        return {"ev": kind, "op": op_id, "w": "w2", "up": up, **extra}

    def delete(op_id: str, fence: int, granted: float, up: float, outcome: str) -> list[dict]:
        extra = {"presented": fence, "highest": 22} if outcome == "stale" else {}
        return [ev("attempt", op_id, granted - 0.1), ev("acquired", op_id, granted, fence=fence),
                ev("write", op_id, up, fence=fence, via="delete", mark="w2.0.0"),
                ev(outcome, op_id, up + 0.05, fence=fence, via="delete", mark="w2.0.0",
                   phase="write", **extra)]

    inserted = [ev("attempt", "w2.0.0", 0.8), ev("acquired", "w2.0.0", 0.9, fence=1),
                ev("write", "w2.0.0", 1.0, fence=1, via="post", mark="w2.0.0"),
                ev("ack", "w2.0.0", 1.05, fence=1, via="post", mark="w2.0.0", phase="write")]
    inserted += op("w3.0.1", 22, 0, up=1.6, granted=1.5, worker="w3")  # the newer holder
    history = [HistoryRow(1, "w2.0.0", "w2", 1, 0, 0, kind="mark_ins"), row(2, "w3.0.1", 22, 0),
               HistoryRow(3, "w2.0.0", "w2", 1, 0, 0, kind="mark_del")]
    refused_then_retried = inserted + delete("w2.0.1", 2, 1.2, 2.0, "stale") + \
        delete("w2.0.2", 30, 2.9, 3.0, "ack")
    assert check(history, 1, refused_then_retried).ok, kinds(check(history, 1, refused_then_retried))
    revived = revived_writes(refused_then_retried, history, [
        {"worker": "w2", "incarnation": 0, "frozen_up": 1.95, "resumed_up": 2.0}])
    assert (revived["attempted"], revived["refused"], revived["committed"]) == (1, 1, 0)
    only_refused = inserted + delete("w2.0.1", 2, 1.2, 2.0, "stale")
    # the refused delete (fence 2) is the only one that could have removed the mark, after
    # fence 22 was committed: refused yet committed, and stale
    assert kinds(check(history, 1, only_refused)) == ["fence_decrease", "rejected_committed",
                                                      "stale_commit"]
