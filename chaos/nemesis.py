"""The nemesis: a seeded fault schedule and the thread that injects it.

Fault kinds (``FAULT_KINDS``):

==============  ==================================================================================
``pause``       SIGSTOP a worker right after its read (it holds the lock and is thinking) for
                more than its TTL, then SIGCONT it at a moment another worker is between its own
                read and write: the frozen holder's write then races the new holder's, the exact
                window fencing must close (and the control modes leave open). See ``_pause``.
``kill_worker`` SIGKILL a worker (one whose write is in flight, when the nemesis catches one),
                restart it 0.1..1 s later (a new incarnation).
``kill_lockd``  SIGKILL lockd, restart it 0.3..1.5 s later on the same port, store and keys.
``crash_pg``    ``pg_ctl -m immediate`` the throwaway PostgreSQL (protected database; lockd's store
                too when the store is ``postgres``), start it 0.3..1.5 s later (crash recovery).
``kill_etcd``   SIGKILL an etcd member (the leader when one answers), restart it 0.5..3 s later.
``skew_wall``   restart a worker under libfaketime with ``FAKETIME_DONT_FAKE_MONOTONIC=1``: its
                wall clock is off by 30 s..1 h (sometimes running at x0.5/x2), monotonic real;
                3..8 s later it is restarted on the real clock.
``skew_all``    the same without ``FAKETIME_DONT_FAKE_MONOTONIC``: monotonic is faked too and the
                clock runs at x0.5, x0.7 or x1.5, so the client misjudges its lease deadline
                (and, a libfaketime quirk, its renewal thread never wakes: see ``workload``).
==============  ==================================================================================

The schedule (``make_schedule``) is a pure function of the seed: a first round with every
applicable kind once, in shuffled order (so a 30 s run sees each kind), then weighted draws
(``pause`` most often: it is the fault that tests the fence). Faults run one at a time in the
nemesis thread; a skew's restore runs in a helper thread after its hold time. A fault that finds no target is
recorded as skipped, not counted.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from chaos.pool import WorkerPool
from chaos.services import Services

__all__ = ["FAULT_KINDS", "Planned", "kinds_for", "make_schedule", "skew_env", "Nemesis"]

FAULT_KINDS = ("pause", "kill_worker", "kill_lockd", "crash_pg", "kill_etcd", "skew_wall",
               "skew_all")
_WEIGHTS = {"pause": 6, "kill_worker": 2, "kill_lockd": 1, "crash_pg": 1, "kill_etcd": 1,
            "skew_wall": 1, "skew_all": 1}
_WALL_OFFSETS = (-3600, -600, -30, 30, 600, 3600)
_WALL_RATES = ("1", "1", "0.5", "2")
_ALL_OFFSETS = (-600, -30, 0, 30, 600)
_ALL_RATES = ("0.5", "0.7", "1.5")


def kinds_for(store: str, resource: str, *, faketime: bool) -> tuple[str, ...]:
    """The fault kinds that apply to a run on ``store`` with the protected ``resource``."""
    out = ["pause", "kill_worker", "kill_lockd"]
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
    if kind == "pause":
        return 2 * ttl + rng.uniform(0.3, 1.0)
    if kind == "kill_worker":
        return rng.uniform(0.1, 1.0)
    if kind in ("kill_lockd", "crash_pg"):
        return rng.uniform(0.3, 1.5)
    if kind == "kill_etcd":
        return rng.uniform(0.5, 3.0)
    return rng.uniform(3.0, 8.0)  # skews


_BUSY_EXTRA = {"pause": 0.5, "kill_worker": 0.0, "kill_lockd": 1.5, "crash_pg": 2.0,
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


class Nemesis(threading.Thread):
    """Injects ``schedule`` into ``services`` and ``pool``; ``finish()`` stops and heals."""

    def __init__(self, schedule: list[Planned], services: Services, pool: WorkerPool, *,
                 ttl: float, faketime: str | None,
                 pause_variants: tuple[str, ...] = ("race", "late")):
        super().__init__(name="nemesis", daemon=True)
        self.ttl = ttl
        self.pause_variants = pause_variants
        self._pauses = 0
        self.schedule = schedule
        self.services = services
        self.pool = pool
        self.faketime = faketime
        self.records: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self._halt = threading.Event()
        self._helpers: list[threading.Thread] = []
        self.t0 = time.monotonic()

    def start(self) -> None:
        """Start injecting; the schedule's times count from now."""
        self.t0 = time.monotonic()
        super().start()

    # -- plumbing ----------------------------------------------------------------------------

    def _now(self) -> float:
        return time.monotonic() - self.t0

    def _wait_until(self, predicate: Callable[[], Any], timeout: float) -> Any:
        """Poll ``predicate`` every 5 ms until truthy (returned), ``timeout`` or stop (None)."""
        deadline = time.monotonic() + timeout
        while not self._halt.is_set():
            value = predicate()
            if value:
                return value
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.005)
        return None

    def _record(self, kind: str, start: float, target: Any, **detail: Any) -> None:
        self.records.append({"kind": kind, "at": round(start, 3), "end": round(self._now(), 3),
                             "target": target, **detail})

    def _helper(self, fn: Callable[..., None], *args: Any) -> None:
        t = threading.Thread(target=self._guard, args=(fn, *args), daemon=True)
        t.start()
        self._helpers.append(t)

    def _guard(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:  # a failed fault or heal is reported, the run goes on
            self.errors.append(f"{getattr(fn, '__name__', fn)}{args}: {exc!r}")

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> None:
        for fault in self.schedule:
            if self._halt.wait(max(0.0, fault.at - self._now())):
                return
            self._guard(self._inject, fault)

    def finish(self) -> None:
        """Stop injecting, undo whatever is still faulty, wait for the helpers."""
        self._halt.set()
        self.join()
        for t in self._helpers:
            t.join()
        for slot in self.pool.slots:
            if slot.paused:
                self.pool.resume(slot.index)
        self._guard(self.services.heal)

    def counts(self) -> dict[str, int]:
        return dict(Counter(r["kind"] for r in self.records if not r.get("skipped")))

    def planned(self) -> list[dict[str, Any]]:
        return [asdict(p) for p in self.schedule]

    # -- the faults --------------------------------------------------------------------------

    def _inject(self, f: Planned) -> None:
        getattr(self, "_" + f.kind)(f)

    def _pick(self, candidates: list[int], f: Planned) -> int:
        return candidates[f.pick % len(candidates)]

    def _pause(self, f: Planned) -> None:
        """Freeze a worker that has just read (within 50 ms, so before its first renewal, its
        lease runs out about one TTL later), keep it frozen more than a TTL, then resume it
        while another worker sits between its read and its write. ``race`` variant: resume as
        soon as that is possible, racing the first holder after it (nobody else has committed
        yet). ``late`` variant: frozen 2 x TTL + 0.3..1 s, several holders may have come and
        gone. Pauses take ``pause_variants`` in turn (the runner: race, late, race, ...; only race
        for ``unfenced-read``, whose window only the first holder after the frozen one opens)."""
        start = self._now()
        fresh = self._wait_until(lambda: self.pool.candidates("read", fresh=0.05), timeout=3.0)
        candidates = fresh or self.pool.candidates()
        if not candidates:
            self._record("pause", start, None, skipped=True)
            return
        i = self._pick(candidates, f)
        variant = self.pause_variants[self._pauses % len(self.pause_variants)]
        self._pauses += 1
        self.pool.pause(i)
        frozen_at = time.monotonic()
        acks_before = self.pool.acks(exclude=[i])
        self._halt.wait(self.ttl + 0.05 if variant == "race" else f.duration)
        other = self._wait_until(lambda: self.pool.candidates("read", exclude=[i]),
                                 timeout=2 * self.ttl + 2.0)
        committed_meanwhile = self.pool.acks(exclude=[i]) - acks_before
        self.pool.resume(i)
        self._record("pause", frozen_at - self.t0, self.pool.slots[i].name, variant=variant,
                     frozen_s=round(time.monotonic() - frozen_at, 3), after_read=bool(fresh),
                     resumed_while_other_read=bool(other),
                     others_committed_meanwhile=committed_meanwhile)

    def _kill_worker(self, f: Planned) -> None:
        """SIGKILL a worker, preferably one whose write is in flight (logged within 20 ms): its
        outcome is then unknown to everybody but the database."""
        start = self._now()
        writing = self._wait_until(lambda: self.pool.candidates("write", fresh=0.02), timeout=2.0)
        candidates = writing or self.pool.candidates()
        if not candidates:
            self._record("kill_worker", start, None, skipped=True)
            return
        i = self._pick(candidates, f)
        state = self.pool.last_event(i)
        self.pool.kill(i)
        self._halt.wait(f.duration)
        self.pool.respawn(i)
        self._record("kill_worker", start, self.pool.slots[i].name, killed_after=state)

    def _kill_lockd(self, f: Planned) -> None:
        start = self._now()
        self.services.kill_lockd()
        self._halt.wait(f.duration)
        self.services.start_lockd()
        self._record("kill_lockd", start, "lockd", back_after_s=round(self._now() - start, 3))

    def _crash_pg(self, f: Planned) -> None:
        start = self._now()
        self.services.crash_pg()
        self._halt.wait(f.duration)
        self.services.start_pg()
        self._record("crash_pg", start, "postgresql", back_after_s=round(self._now() - start, 3))

    def _kill_etcd(self, f: Planned) -> None:
        start = self._now()
        leader = self.services.etcd_leader()
        i = leader if leader is not None else f.pick % 3
        self.services.kill_etcd(i)
        self._halt.wait(f.duration)
        self.services.restart_etcd(i)
        self._record("kill_etcd", start, f"m{i}", leader=leader is not None,
                     back_after_s=round(self._now() - start, 3))

    def _skew(self, f: Planned) -> None:
        start = self._now()
        candidates = [i for i in self.pool.candidates() if self.pool.slots[i].skew is None]
        if not candidates or not self.faketime or f.spec is None:
            self._record(f.kind, start, None, skipped=True)
            return
        i = self._pick(candidates, f)
        self._helper(self._skew_cycle, i, skew_env(f.kind, f.spec, self.faketime), f.duration)
        self._record(f.kind, start, self.pool.slots[i].name, faketime=f.spec, hold_s=f.duration)

    def _skew_cycle(self, i: int, env: dict[str, str], hold: float) -> None:
        """Restart worker ``i`` under ``env``, keep it skewed ``hold`` s, restart it unskewed."""
        self.pool.replace(i, env)
        self._halt.wait(hold)
        self.pool.replace(i, None)

    _skew_wall = _skew
    _skew_all = _skew
