"""The nemesis's fault schedule: which fault kinds apply to a run, and the seeded plan of
when each fault starts and how long it holds (``chaos.nemesis`` injects it; the kinds are
described there).

The schedule (``make_schedule``) is a pure function of the seed: a first round with every
applicable kind once, in shuffled order (so a 45 s run sees each kind), then weighted draws
(the freezes and the handoff most often: they are the faults that test the fence). Faults run
one at a time in the nemesis thread; a skew's restore runs in a helper thread after its hold
time. A fault that finds no target is recorded as skipped, not counted, and its kind is owed:
it takes the next slot of a kind already injected (``Nemesis.run``).
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

__all__ = ["FAULT_KINDS", "PAUSE_KINDS", "Planned", "kinds_for", "make_schedule", "skew_env"]

FAULT_KINDS = ("pause", "pause_grant", "pause_write", "handoff", "kill_after_read",
               "pause_shared", "stop_proxy", "db_delay", "kill_worker", "kill_lockd", "crash_pg", "kill_etcd",
               "skew_wall", "skew_all")
PAUSE_KINDS = ("pause", "pause_grant", "pause_write", "handoff", "kill_after_read",
               "pause_shared")
"""The faults that freeze a worker holding a lease (their records feed the revived-write count)."""
_WEIGHTS = {"pause": 3, "pause_grant": 3, "pause_write": 2, "handoff": 4, "kill_after_read": 3,
            "pause_shared": 8,
            "stop_proxy": 1, "db_delay": 1, "kill_worker": 2, "kill_lockd": 1, "crash_pg": 1,
            "kill_etcd": 1, "skew_wall": 1, "skew_all": 1}
_WALL_OFFSETS = (-3600, -600, -30, 30, 600, 3600)
_WALL_RATES = ("1", "1", "0.5", "2")
_ALL_OFFSETS = (-600, -30, 0, 30, 600)
_ALL_RATES = ("0.5", "0.7", "1.5")


def kinds_for(store: str, resource: str, *, faketime: bool,
              workload: str = "counter") -> tuple[str, ...]:
    """The fault kinds that apply to a run on ``store`` with the protected ``resource``
    (``pause_shared`` only where readers share the lock: ``rw``)."""
    out = ["pause", "pause_grant", "pause_write", "handoff", "kill_after_read", "stop_proxy",
           "kill_worker", "kill_lockd"]
    if workload == "rw":
        out.append("pause_shared")
    if resource == "postgres":
        out.append("db_delay")
    if store == "postgres" or resource == "postgres":
        out.append("crash_pg")
    if store == "etcd":
        out.append("kill_etcd")
    if faketime:
        out += ["skew_wall", "skew_all"]
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Planned:
    """One fault of the schedule: start ``at`` seconds into the run, ``duration`` seconds down."""

    at: float
    kind: str
    duration: float
    pick: int
    """Chooses the target among the candidates found at injection time (``pick % n``)."""
    spec: str | None = None
    """The ``FAKETIME`` value of a skew."""


def _duration(kind: str, rng: random.Random, ttl: float) -> float:
    if kind in PAUSE_KINDS:
        return 2 * ttl + rng.uniform(0.3, 1.0)
    if kind == "stop_proxy":
        return ttl + rng.uniform(0.1, 0.8)
    if kind == "db_delay":
        return rng.uniform(2.0, 5.0)
    if kind == "kill_worker":
        return rng.uniform(0.1, 1.0)
    if kind in ("kill_lockd", "crash_pg"):
        return rng.uniform(0.3, 1.5)
    if kind == "kill_etcd":
        return rng.uniform(0.5, 3.0)
    return rng.uniform(3.0, 8.0)  # skews


_BUSY_EXTRA = {"pause": 0.5, "pause_grant": 0.5, "pause_write": 0.5, "handoff": 1.0,
               "kill_after_read": 1.0, "pause_shared": 1.0, "stop_proxy": 0.5, "db_delay": 0.0, "kill_worker": 0.0, "kill_lockd": 1.5, "crash_pg": 2.0,
               "kill_etcd": 1.0}


def make_schedule(seed: int | str, kinds: tuple[str, ...], seconds: float, ttl: float, *,
                  start: float = 1.5) -> list[Planned]:
    """The faults of a ``seconds``-long run (none starts in the last 2 s)."""
    rng = random.Random(f"nemesis:{seed}")
    first = list(kinds)
    rng.shuffle(first)
    weights = [_WEIGHTS[k] for k in kinds]
    out: list[Planned] = []
    at = start
    for n in itertools.count():
        kind = first[n] if n < len(first) else rng.choices(kinds, weights)[0]
        if at > seconds - 2:
            break
        duration = _duration(kind, rng, ttl)
        spec = None
        if kind == "skew_wall":
            spec = f"{rng.choice(_WALL_OFFSETS):+d}s x{rng.choice(_WALL_RATES)}"
        elif kind == "skew_all":
            spec = f"{rng.choice(_ALL_OFFSETS):+d}s x{rng.choice(_ALL_RATES)}"
        out.append(Planned(round(at, 3), kind, round(duration, 3), rng.randrange(1 << 30), spec))
        busy = duration + _BUSY_EXTRA[kind] if kind in _BUSY_EXTRA else 0.3
        at += busy + rng.uniform(0.3, 1.2)
    return out


def skew_env(kind: str, spec: str, lib: str) -> dict[str, str]:
    """The environment that runs a worker under libfaketime for a ``skew_*`` fault."""
    env = {"LD_PRELOAD": lib, "FAKETIME": spec}
    if kind == "skew_wall":
        env["FAKETIME_DONT_FAKE_MONOTONIC"] = "1"
    return env
