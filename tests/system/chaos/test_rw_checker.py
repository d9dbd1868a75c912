"""The ``rw`` and ``sem`` checkers on small hand-made histories: a clean history of writers
and readers passes; a write under a shared token, a shared grant inside an exclusive lease, a
stale or phantom read, and a semaphore with limit + 1 live permits are each flagged."""

from __future__ import annotations

from chaos.checker import HistoryRow
from chaos.rwcheck import check_rw, check_sem

TTL = 1.0


def writer(op_id: str, fence: int, read: int, *, granted: float, up: float,
           outcome: str | None = "ack", release: float | None = None, w: str = "w1") -> list[dict]:
    """A writer's exclusive read-modify-write of the counter (granted at ``granted``, read and
    write at ``up``, released at ``release``, default ``up`` + 0.2)."""
    events = [
        {"ev": "attempt", "op": op_id, "w": w, "up": granted},
        {"ev": "acquired", "op": op_id, "w": w, "fence": fence, "up": granted},
        {"ev": "read", "op": op_id, "w": w, "fence": fence, "value": read, "up": up},
        {"ev": "write", "op": op_id, "w": w, "fence": fence, "read": read, "wrote": read + 1,
         "via": "batch", "up": up},
    ]
    if outcome is not None:
        events.append({"ev": outcome, "op": op_id, "w": w, "phase": "write", "fence": fence,
                       "read": read, "wrote": read + 1, "up": up + 0.1})
    events.append({"ev": "release", "op": op_id, "w": w, "fence": fence,
                   "up": up + 0.2 if release is None else release})
    return events


def reader(op_id: str, epoch: int, *, granted: float, sent: float, value: int | None = None,
           stale: int | None = None, write: tuple[str, int, str | None] | None = None,
           w: str = "w2") -> list[dict]:
    """A reader's shared lease: an allowed read of ``value``, a 409 naming ``stale``, or a
    write attempt answered ``write`` = (event, status, code)."""
    events = [
        {"ev": "attempt", "op": op_id, "w": w, "up": granted - 0.01},
        {"ev": "acquired", "op": op_id, "w": w, "fence": epoch, "mode": "shared", "up": granted},
        {"ev": "blind", "op": op_id, "w": w, "fence": epoch, "mode": "shared", "up": granted},
    ]
    if value is not None:
        events.append({"ev": "observe", "op": op_id, "w": w, "fence": epoch, "value": value,
                       "sent": sent, "up": sent + 0.01})
    if stale is not None:
        events.append({"ev": "stale", "op": op_id, "w": w, "phase": "read", "fence": epoch,
                       "presented": epoch, "highest": stale, "status": 409, "up": sent + 0.01})
    if write is not None:
        ev, status, code = write
        events.append({"ev": "write", "op": op_id, "w": w, "fence": epoch, "via": "patch",
                       "mark": op_id, "shared": True, "up": sent})
        events.append({"ev": ev, "op": op_id, "w": w, "phase": "write", "fence": epoch,
                       "status": status, "code": code, "up": sent + 0.01})
    events.append({"ev": "release", "op": op_id, "w": w, "fence": epoch, "up": sent + 0.05})
    return events


def counter_row(i: int, op_id: str, fence: int, read: int) -> HistoryRow:
    return HistoryRow(i, op_id, "w1", fence, read, read + 1, kind="counter", seq=i)


def kinds(result) -> set[str]:
    return {v.kind for v in result.violations}


def _clean() -> tuple[list[HistoryRow], list[dict]]:
    events = (writer("a", 1, 0, granted=10.0, up=10.2)
              + reader("r1", 1, granted=10.6, sent=10.8, value=1)
              + reader("r2", 1, granted=10.6, sent=10.9, value=1,
                       write=("rejected", 403, "shared_token"))
              # r3's lease (granted 10.7) lapsed before b's grant; frozen, it reads after b wrote
              + writer("b", 2, 1, granted=11.9, up=12.1)
              + reader("r3", 1, granted=10.7, sent=12.5, stale=2)
              + reader("r4", 2, granted=12.6, sent=12.7, value=2))
    return [counter_row(1, "a", 1, 0), counter_row(2, "b", 2, 1)], events


def test_a_clean_history_of_writers_and_readers_passes():
    history, events = _clean()
    result = check_rw(history, 2, events, ttl=TTL)
    assert result.violations == [], result.violations
    assert result.stats["readers"] == 4 and result.stats["reads_allowed"] == 3
    assert result.stats["reads_stale"] == 1 and result.stats["shared_writes_refused"] == 1


def test_a_write_under_a_shared_token_is_flagged_however_it_shows():
    history, events = _clean()
    # committed: the reader's op is in the history
    committed = [*history, counter_row(3, "r2", 2, 2)]
    assert "shared_write" in kinds(check_rw(committed, 3, events, ttl=TTL))
    # answered 200, or 409 (it reached the fence check): the 403 was due
    for answer in (("ack", 200, None), ("stale", 409, "stale_token")):
        evs = (writer("a", 1, 0, granted=10.0, up=10.2)
               + reader("r9", 1, granted=10.6, sent=10.8, write=answer))
        assert "shared_write" in kinds(check_rw(history[:1], 1, evs, ttl=TTL)), answer


def test_a_shared_grant_inside_an_exclusive_lease_is_an_overlap():
    history, _ = _clean()
    # a holds fence 1 exclusive from 10.0 until its release at 10.9; r is granted at 10.3
    events = (writer("a", 1, 0, granted=10.0, up=10.2, release=10.9)
              + reader("r", 1, granted=10.3, sent=10.4, value=0))
    found = check_rw(history[:1], 1, events, ttl=TTL)
    assert "lease_overlap" in kinds(found), found.violations
    # and an exclusive grant while an older epoch's reader is still live
    events = (writer("a", 1, 0, granted=10.0, up=10.2)
              + reader("r", 1, granted=10.6, sent=12.5, value=1)  # renews: live past 11
              + [{"ev": "renewed", "op": "r", "w": "w2", "sent": 11.3, "up": 11.31}]
              + writer("b", 2, 1, granted=11.5, up=11.6))
    found = check_rw(history, 2, events, ttl=TTL)
    assert "lease_overlap" in kinds(found), found.violations


def test_a_read_older_than_an_acknowledged_write_is_stale():
    history, _ = _clean()
    events = (writer("a", 1, 0, granted=10.0, up=10.2)
              + writer("b", 2, 1, granted=11.0, up=11.2)
              # epoch 1 read allowed after b (fence 2) acknowledged at 11.3: must have been 409
              + reader("r", 1, granted=10.7, sent=11.6, value=2))
    assert kinds(check_rw(history, 2, events, ttl=None)) == {"stale_read"}
    # returned the value before b's acknowledged write, with an up-to-date epoch
    events = (writer("a", 1, 0, granted=10.0, up=10.2)
              + writer("b", 2, 1, granted=11.0, up=11.2)
              + reader("r", 2, granted=11.4, sent=11.6, value=1))
    assert kinds(check_rw(history, 2, events, ttl=None)) == {"stale_read"}
    events = (writer("a", 1, 0, granted=10.0, up=10.2)
              + reader("r", 1, granted=10.6, sent=10.8, value=7))
    assert kinds(check_rw(history[:1], 1, events, ttl=None)) == {"phantom_read"}


def test_a_shared_grant_asked_after_a_newer_exclusive_grant_carries_its_epoch():
    history, _ = _clean()
    events = (writer("a", 1, 0, granted=10.0, up=10.2)
              + writer("b", 2, 1, granted=11.0, up=11.2)
              + reader("r", 1, granted=11.6, sent=11.7, stale=2))  # asked at 11.59 > 11.0
    assert kinds(check_rw(history, 2, events, ttl=None)) == {"fence_order"}


# -- semaphores --------------------------------------------------------------------------------

def permit(op_id: str, fence: int, slot: int, *, granted: float, up: float, limit: int = 2,
           outcome: str | None = "ack", w: str = "w1") -> list[dict]:
    lock = f"sem/chaos/{slot}"
    events = [
        {"ev": "attempt", "op": op_id, "w": w, "up": granted - 0.01},
        {"ev": "acquired", "op": op_id, "w": w, "fence": fence, "mode": "permit", "slot": slot,
         "limit": limit, "fences": {lock: fence}, "up": granted},
        {"ev": "write", "op": op_id, "w": w, "fence": fence, "via": "post", "mark": op_id,
         "slot": slot, "up": up},
    ]
    if outcome is not None:
        events.append({"ev": outcome, "op": op_id, "w": w, "phase": "write", "fence": fence,
                       "via": "post", "mark": op_id, "up": up + 0.01})
    events.append({"ev": "release", "op": op_id, "w": w, "fence": fence, "up": up + 0.05})
    return events


def smark(i: int, op_id: str, slot: int, fence: int) -> HistoryRow:
    return HistoryRow(i, op_id, str(slot), fence, 0, 0, kind="smark", seq=i)


def test_a_clean_semaphore_history_passes_and_limit_plus_one_is_an_overflow():
    events = (permit("p1", 1, 0, granted=10.0, up=10.3)
              + permit("p2", 2, 1, granted=10.1, up=10.3)
              + permit("p3", 3, 0, granted=10.5, up=10.7))  # after p1 released at 10.35
    history = [smark(1, "p1", 0, 1), smark(2, "p2", 1, 2), smark(3, "p3", 0, 3)]
    result = check_sem(history, events, ttl=TTL)
    assert result.violations == [], result.violations
    assert result.stats["permits"] == 3
    crowded = (permit("p1", 1, 0, granted=10.0, up=10.6)
               + permit("p2", 2, 1, granted=10.1, up=10.6)
               + permit("p3", 3, 2, granted=10.2, up=10.6))  # three live at once, limit 2
    history = [smark(1, "p1", 0, 1), smark(2, "p2", 1, 2), smark(3, "p3", 2, 3)]
    assert "sem_overflow" in kinds(check_sem(history, crowded, ttl=TTL))


def test_a_slot_granted_twice_or_a_reused_permit_fence_is_flagged():
    twice = (permit("p1", 1, 0, granted=10.0, up=10.6)
             + permit("p2", 2, 0, granted=10.1, up=10.6))  # slot 0 while p1 is live
    history = [smark(1, "p1", 0, 1), smark(2, "p2", 0, 2)]
    assert "lease_overlap" in kinds(check_sem(history, twice, ttl=TTL))
    reused = (permit("p1", 1, 0, granted=10.0, up=10.3)
              + permit("p2", 1, 1, granted=10.1, up=10.3))
    history = [smark(1, "p1", 0, 1), smark(2, "p2", 1, 1)]
    assert "fence_reused" in kinds(check_sem(history, reused, ttl=TTL))
    lapsed = (permit("p1", 1, 0, granted=10.0, up=12.0)  # wrote after p2 got its slot
              + permit("p2", 2, 0, granted=11.2, up=11.4))
    history = [smark(1, "p2", 0, 2), smark(2, "p1", 0, 1)]
    assert "fence_decrease" in kinds(check_sem(history, lapsed, ttl=TTL))


def test_a_lapsed_writers_write_after_a_readers_fenced_read_is_flagged():
    # a (fence 1) froze after its read; its lease ran out at 11.0, r took the lock shared at
    # 11.2 and read at 11.3; a thawed and wrote at 11.6, and the write committed
    for epoch in (1, 2):  # the epoch a's fence ended in, or the new one after its lapse
        events = (writer("a", 1, 0, granted=10.0, up=11.6)
                  + reader("r", epoch, granted=11.2, sent=11.3, value=0))
        found = check_rw([counter_row(1, "a", 1, 0)], 1, events, ttl=TTL)
        assert kinds(found) == {"lapsed_write"}, (epoch, found.violations)
        assert [v.op for v in found.violations] == ["a"]
    # a blind mark write and a DELETE count alike
    mark = [{**e, "via": "post", "mark": "a"} if e["ev"] == "write" else e
            for e in writer("a", 1, 0, granted=10.0, up=11.6) if e["ev"] != "read"]
    events = mark + reader("r", 1, granted=11.2, sent=11.3, value=0)
    found = check_rw([HistoryRow(1, "a", "w1", 1, 0, 0, kind="mark_ins", seq=1)], 0, events,
                     ttl=TTL)
    assert kinds(found) == {"lapsed_write"}, found.violations


def test_a_lapsed_write_refused_or_sent_before_the_read_is_no_violation():
    # refused: the reader's read had raised the highest to its new epoch
    refused = [{**e, "presented": 1, "highest": 2, "status": 409} if e["ev"] == "stale" else e
               for e in writer("a", 1, 0, granted=10.0, up=11.6, outcome="stale")]
    events = refused + reader("r", 2, granted=11.2, sent=11.3, value=0)
    assert check_rw([], 0, events, ttl=TTL).violations == []  # the 409 names r's epoch
    # sent before the reader's read was answered: it may commit (nothing was read yet)
    events = (writer("a", 1, 0, granted=10.0, up=11.25)
              + reader("r", 1, granted=11.2, sent=11.3, value=1))
    assert check_rw([counter_row(1, "a", 1, 0)], 1, events, ttl=TTL).violations == []
    # a newer writer's write after the read is not lapsed
    events = (reader("r", 1, granted=11.2, sent=11.3, value=0)
              + writer("b", 2, 0, granted=11.5, up=11.7))
    assert check_rw([counter_row(1, "b", 2, 0)], 1, events, ttl=TTL).violations == []
