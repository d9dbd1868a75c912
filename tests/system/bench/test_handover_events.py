"""The election handover driver's event reading (``bench.primitives.Events``): a successor can
report its lead before the resigned leader reports its resignation, and neither report is lost."""

from __future__ import annotations

import queue

import pytest

from bench.primitives import Events


def _events(*docs: dict) -> Events:
    q: queue.Queue = queue.Queue()
    for doc in docs:
        q.put(doc)
    return Events(q, lambda: "test", grant_renews=True)


def test_a_successor_reporting_before_the_resignation_is_kept() -> None:
    ev = _events({"event": "waiting", "pid": 2, "t": 1.0},
                 {"event": "leader", "pid": 2, "granted": 2.0, "written": 2.1},
                 {"event": "resigned", "pid": 1, "t": 1.9})
    assert ev.next("resigned", timeout=1)["pid"] == 1
    assert ev.next("leader", timeout=0.2)["pid"] == 2  # not dropped while reading for 'resigned'
    assert ev.waiting == {2: 1.0}
    assert ev.renewed == {2: 2.0}  # a lockd lease runs from its grant


def test_reports_of_one_kind_come_in_order_and_once() -> None:
    ev = _events({"event": "leader", "pid": 1, "granted": 1.0, "written": 1.0},
                 {"event": "renewed", "pid": 1, "t": 1.5},
                 {"event": "leader", "pid": 2, "granted": 3.0, "written": 3.0})
    assert [ev.next("leader", 1)["pid"], ev.next("leader", 1)["pid"]] == [1, 2]
    assert ev.renewed == {1: 1.5, 2: 3.0}
    with pytest.raises(RuntimeError, match="no 'leader' report"):
        ev.next("leader", timeout=0.2)
