"""The ``election`` checker on small hand-made histories: clean terms pass; an entry of an older
term committed after a newer one, a term written by two leaders, two leaders at once and an
entry committed after the fence table moved on are each flagged."""

from __future__ import annotations

from chaos.checker import HistoryRow
from chaos.electcheck import check_election

TTL = 1.0
LOCK = "chaos/election"


def leader(op_id: str, fence: int, *, granted: float, entries: list[tuple[float, str | None]],
           release: float | None = None, w: str = "w1") -> list[dict]:
    """A campaign won with ``fence`` at ``granted``; each entry (sent at uptime, outcome) is
    ``<op>.<n>``; resigned at ``release`` (default: after the last entry)."""
    events = [{"ev": "attempt", "op": op_id, "w": w, "up": granted - 0.01},
              {"ev": "acquired", "op": op_id, "w": w, "fence": fence, "mode": "leader",
               "up": granted}]
    last = granted
    for n, (up, outcome) in enumerate(entries, start=1):
        entry = f"{op_id}.{n}"
        events.append({"ev": "write", "op": op_id, "w": w, "fence": fence, "via": "post",
                       "mark": entry, "entry": entry, "term": fence, "n": n, "up": up})
        if outcome is not None:
            events.append({"ev": outcome, "op": op_id, "w": w, "phase": "write", "fence": fence,
                           "entry": entry, "mark": entry, "status": 409 if outcome == "stale"
                           else None, "up": up + 0.01})
        last = up
    events.append({"ev": "release", "op": op_id, "w": w, "fence": fence,
                   "up": last + 0.05 if release is None else release})
    return events


class Log:
    """The history in commit order: term entries and the fence table's changes."""

    def __init__(self) -> None:
        self.rows: list[HistoryRow] = []

    def entry(self, entry: str, term: int, n: int = 1) -> Log:
        i = len(self.rows) + 1
        self.rows.append(HistoryRow(i, entry, "w", term, n, 0, kind="term", seq=i))
        return self

    def fence(self, highest: int) -> Log:
        i = len(self.rows) + 1
        self.rows.append(HistoryRow(i, LOCK, "", highest, 0, 0, kind="fence", seq=i))
        return self


def kinds(result) -> set[str]:
    return {v.kind for v in result.violations}


def test_clean_terms_pass_with_a_refused_old_leader():
    events = (leader("a", 1, granted=10.0, entries=[(10.1, "ack"), (10.2, "ack")])
              + leader("b", 2, granted=10.5, entries=[(10.6, "ack")], w="w2")
              # a leader frozen past its lease wakes up and is refused
              + leader("c", 3, granted=11.0, entries=[(11.1, "ack"), (13.5, "stale")],
                       release=13.6, w="w3")
              + leader("d", 4, granted=12.2, entries=[(12.3, "ack")], w="w4"))
    log = (Log().fence(1).entry("a.1", 1).entry("a.2", 1, 2).fence(2).entry("b.1", 2)
           .fence(3).entry("c.1", 3).fence(4).entry("d.1", 4))
    result = check_election(log.rows, events, lock=LOCK, ttl=TTL)
    assert result.violations == [], result.violations
    assert result.stats["leaders"] == 4 and result.stats["terms_written"] == 4
    assert result.stats["entries_acked"] == 5 and result.stats["entries_stale"] == 1


def test_an_entry_of_an_older_term_after_a_newer_one_is_flagged():
    events = (leader("a", 1, granted=10.0, entries=[(10.1, "ack"), (12.0, "ack")], release=12.1)
              + leader("b", 2, granted=11.2, entries=[(11.3, "ack")], w="w2"))
    log = Log().entry("a.1", 1).entry("b.1", 2).entry("a.2", 1, 2)
    found = kinds(check_election(log.rows, events, lock=LOCK, ttl=None))
    assert "term_order" in found and "stale_commit" in found, found
    # the database's fence table alone convicts it too
    log = Log().entry("a.1", 1).fence(2).entry("a.2", 1, 2)
    events = leader("a", 1, granted=10.0, entries=[(10.1, "ack"), (12.0, "unknown")])
    assert kinds(check_election(log.rows, events, lock=LOCK, ttl=None)) == {"stale_commit"}


def test_a_term_won_twice_or_two_leaders_at_once_are_flagged():
    reused = (leader("a", 1, granted=10.0, entries=[(10.1, "ack")])
              + leader("b", 1, granted=11.5, entries=[(11.6, "ack")], w="w2"))
    log = Log().entry("a.1", 1).entry("b.1", 1)
    found = kinds(check_election(log.rows, reused, lock=LOCK, ttl=TTL))
    assert {"fence_reused", "two_leaders"} <= found, found
    # b elected at 10.3 while a (granted 10.0, resigned at 10.9) still led
    both = (leader("a", 1, granted=10.0, entries=[(10.8, "ack")], release=10.9)
            + leader("b", 2, granted=10.3, entries=[(10.4, "ack")], w="w2"))
    log = Log().entry("b.1", 2).entry("a.1", 1)
    found = kinds(check_election(log.rows, both, lock=LOCK, ttl=TTL))
    assert {"lease_overlap", "term_order"} <= found, found


def test_acknowledged_missing_refused_committed_and_phantom_entries():
    events = leader("a", 1, granted=10.0, entries=[(10.1, "ack"), (10.2, "stale")])
    log = Log().entry("a.2", 1, 2).entry("zz.1", 5)
    found = kinds(check_election(log.rows, events, lock=LOCK, ttl=None))
    assert found == {"acked_missing", "rejected_committed", "phantom"}, found
