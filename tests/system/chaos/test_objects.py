"""The ``objects`` chaos workload: its checker on hand-made histories (each violation kind
found, a clean history passes), a short real run with frozen holders and a crashing proxy that
passes, and a planted bug (the pointer moved without the fence check) that it catches."""

from __future__ import annotations

import pytest

from chaos.mutants import MUTANTS, run_mutant
from chaos.objcheck import check_objects
from chaos.objrun import run_objects


def _tag(w: int, fence: int, n: int) -> dict[str, int]:
    return {"w": w, "fence": fence, "n": n}


def _history() -> list[dict]:
    """A holder of fence 1 writes, a holder of fence 2 writes; the revived fence-1 holder's
    write is refused."""
    return [
        {"t": 1.0, "ev": "write", "tag": _tag(0, 1, 1), "fence": 1},
        {"t": 1.1, "ev": "ack", "tag": _tag(0, 1, 1), "fence": 1, "version": 1},
        {"t": 2.0, "ev": "write", "tag": _tag(1, 2, 2), "fence": 2},
        {"t": 2.1, "ev": "ack", "tag": _tag(1, 2, 2), "fence": 2, "version": 2},
        {"t": 3.0, "ev": "write", "tag": _tag(0, 1, 3), "fence": 1},
        {"t": 3.1, "ev": "stale", "tag": _tag(0, 1, 3), "fence": 1, "highest": 2},
    ]


def _read(start: float, tag: dict, fence: int, version: int) -> dict:
    return {"start": start, "end": start + 0.01, "tag": tag, "fence": fence, "version": version}


def test_a_clean_history_passes():
    reads = [_read(1.5, _tag(0, 1, 1), 1, 1), _read(2.5, _tag(1, 2, 2), 2, 2),
             _read(3.5, _tag(1, 2, 2), 2, 2)]
    out = check_objects(_history(), reads, [], [])
    assert out["violation_count"] == 0, out["violations"]
    assert (out["stats"]["acknowledged"], out["stats"]["stale"]) == (2, 1)


@pytest.mark.parametrize(("read", "kind"), [
    (_read(3.5, _tag(0, 1, 3), 1, 3), "stale_visible"),  # the refused write shown
    (_read(2.5, _tag(0, 1, 1), 2, 2), "torn"),  # fence-1 bytes under the fence-2 pointer
    (_read(2.5, _tag(9, 2, 9), 2, 2), "phantom"),
    (_read(2.5, _tag(0, 1, 1), 1, 1), "acked_missing"),  # version 2 was acknowledged
])
def test_each_read_violation_is_found(read, kind):
    out = check_objects(_history(), [read], [], [])
    assert kind in out["violations_by_kind"], out["violations"]


def test_a_stale_write_acknowledged_and_orphans_are_violations():
    history = _history()
    history[-1] = {"t": 3.1, "ev": "ack", "tag": _tag(0, 1, 3), "fence": 1, "version": 3}
    out = check_objects(history, [], ["blobs/ab/ab12"], ["tmp/cd34"])
    assert out["violations_by_kind"] == {"stale_acked": 1, "orphan_kept": 1,
                                         "orphan_survived": 1}, out["violations"]


def test_a_short_run_with_frozen_holders_and_a_crashing_proxy_passes():
    # pauses and crashes only (no stalls), for long enough that a thawed holder's write meets a
    # newer holder's on a loaded machine too: a run with no stale write proves nothing
    report = run_objects(seconds=18, seed=11, workers=3, resource="sqlite",
                         faults=("pause", "crash_proxy"))
    assert report["passed"], (report["violations"][:5], report["ops"], report["faults"])
    assert report["ops"]["stale"] > 0 and report["ops"]["acknowledged"] > 0
    assert report["faults"].get("pause", 0) > 0


@pytest.mark.slow
def test_the_checker_catches_the_pointer_moved_without_the_fence_check():
    mutant = next(m for m in MUTANTS if m.name == "object_pointer_unfenced")
    out = run_mutant(mutant, seconds=20, seed=4242)
    assert out["detected"], (out["report"]["ops"], out["report"]["faults"])
    assert {"stale_visible", "stale_acked"} & set(out["kinds"]), out["kinds"]
