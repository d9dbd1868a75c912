"""The nemesis's loop: every applicable kind is injected in a short run, even when its slot
finds no target (all workers restarting, say)."""

from __future__ import annotations

from chaos.nemesis import Nemesis, Planned


class _Scripted(Nemesis):
    """Records each injection; the first ``misses[kind]`` attempts of a kind find no target."""

    def __init__(self, schedule: list[Planned], misses: dict[str, int]):
        super().__init__(schedule, services=None, pool=None, ttl=1.0, faketime=None)
        self.misses = dict(misses)
        self.tried: list[str] = []

    def _inject(self, f: Planned) -> None:
        self.tried.append(f.kind)
        if self.misses.get(f.kind, 0) > 0:
            self.misses[f.kind] -= 1
            self._record(f.kind, 0.0, None, skipped=True)
        else:
            self._record(f.kind, 0.0, "w1")


def _run(kinds: list[str], misses: dict[str, int]) -> _Scripted:
    n = _Scripted([Planned(0.0, k, 0.1, i) for i, k in enumerate(kinds)], misses)
    n.run()
    return n


def test_a_kind_whose_slot_found_no_target_takes_the_next_slot_of_a_kind_already_done():
    n = _run(["pause", "kill_after_read", "pause", "stop_proxy", "pause"],
             {"kill_after_read": 1})
    assert n.tried == ["pause", "kill_after_read", "kill_after_read", "stop_proxy", "pause"]
    assert set(n.counts()) == {"pause", "kill_after_read", "stop_proxy"}


def test_an_owed_kind_stays_owed_until_injected_and_never_displaces_a_kind_not_yet_seen():
    n = _run(["handoff", "pause", "stop_proxy", "pause", "pause", "pause"], {"handoff": 2})
    # stop_proxy (never injected) keeps its slot; handoff takes two slots of pause, the first
    # of which finds no target again
    assert n.tried == ["handoff", "pause", "stop_proxy", "handoff", "handoff", "pause"]
    assert n.counts() == {"pause": 2, "stop_proxy": 1, "handoff": 1}


def test_a_kind_injected_in_its_own_later_slot_is_no_longer_owed():
    n = _run(["pause", "handoff", "handoff", "pause"], {"handoff": 1})
    assert n.tried == ["pause", "handoff", "handoff", "pause"]
    assert n.counts() == {"pause": 2, "handoff": 1}
