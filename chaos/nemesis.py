"""The nemesis: a seeded fault schedule and the thread that injects it.

Fault kinds (``FAULT_KINDS``):

==============  ==================================================================================
``pause``       SIGSTOP a worker right after its read (it holds the lock and is thinking) for
                more than its TTL, then SIGCONT it at a moment another worker is between its own
                read and write: the frozen holder's write then races the new holder's, the exact
                window fencing must close (and the control modes leave open). Variants ``race``,
                ``late`` and ``edge`` (thawed right around the TTL edge). See ``_pause``.
``pause_grant`` SIGSTOP a worker right after its grant, before any claim (a blind writer, or a
                reader about to claim), past its TTL; thaw it within 30 ms of a newer holder's
                blind batch being acknowledged (nothing but that batch raised the highest past
                the frozen fence, if the proxy raised it at all).
``pause_write`` SIGSTOP a worker whose write is in flight (logged within 20 ms), past its TTL.
``handoff``     combined: freeze A after its read or grant, about to send a batch (the write
                that takes several statements); once A's lease ran out and B was granted
                (caught within 30 ms), freeze B before its claim, thaw A (its stale write now arrives while
                the proxy's highest is still A's fence), thaw B when A's fence check has reached
                the database but A's write has not committed: the database is slowed
                (``db_delay``, 30..250 ms a chunk) and B thawed 2.5 x that after A's write left
                (0..40 ms without a relay). A proxy that checks and writes in two steps lets
                B's claim land between them; a correct one makes B's claim wait for A's COMMIT.
``kill_after_read`` combined: freeze A after its read; once B has claimed and read, SIGKILL B
                (it never writes), thaw A: A's write must be refused although nothing newer
                was written (the blind-spot history).
``pause_shared`` (``rw`` only) freeze a writer (an exclusive holder) right after its read or grant,
                past its TTL; thaw it 50 ms after a reader's fenced read answered under an
                epoch at least the writer's fence: the lapsed writer's write then arrives while
                readers hold the lock shared, often with nothing but their reads after it.
``stop_proxy``  SIGSTOP the proxy while a write is in flight, past a TTL, then SIGCONT it: the
                frozen requests proceed beside the new holders'.
``db_delay``    the proxy's database connection (``chaos.relay``) holds each chunk 30..250 ms
                for 2..5 s: every check-then-act window in the proxy stays open that long.
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

Under the ``transfer`` workload the combined faults and the pause's "another worker between
read and write" pick a newer holder of one of the frozen transfer's accounts (``_overlaps``):
a holder of two other accounts races nothing.

The schedule is planned by ``chaos.schedule`` (a pure function of the seed); faults run
one at a time in the nemesis thread.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

from chaos.pool import WorkerPool
from chaos.schedule import FAULT_KINDS, PAUSE_KINDS, Planned, kinds_for, make_schedule, skew_env
from chaos.services import Services
from chaos.workload import uptime

__all__ = ["FAULT_KINDS", "PAUSE_KINDS", "Planned", "kinds_for", "make_schedule", "skew_env", "Nemesis"]

_WRITING = ("read", "renew_lost", "renewed", "write")
"""A thawed holder's last events before its write is answered (any other: it is past it)."""


def _key(lock: str) -> str:
    """What follows a lock name's first segment: the account of ``accounts/10`` (``10``), and
    ``1/x`` for the neighbour ``accounts/1/x``, which nests in account 1's name, not its lock."""
    return lock.split("/", 1)[-1]


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

    # -- Plumbing ----------------------------------------------------------------------------

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

    # -- The loop ----------------------------------------------------------------------------

    def run(self) -> None:
        """Inject the schedule in order. A kind whose every attempt so far found no target (all
        workers restarting after a skew or a crash, say) is owed: it takes the next slot of a
        kind already injected, so a short run sees each applicable kind whatever the machine's
        timing."""
        owed: dict[str, Planned] = {}
        for fault in self.schedule:
            if self._halt.wait(max(0.0, fault.at - self._now())):
                return
            done = self.counts()
            for kind in [k for k in owed if k in done]:
                del owed[kind]
            if owed and fault.kind in done:
                fault = replace(owed.pop(next(iter(owed))), at=fault.at)
            self._guard(self._inject, fault)
            if fault.kind not in self.counts():
                owed.setdefault(fault.kind, fault)

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

    def pauses(self) -> list[dict[str, Any]]:
        """Every freeze of a worker (``{worker, incarnation, frozen_up, resumed_up, kind,
        variant}``), for ``checker.revived_writes``."""
        return [dict(f, kind=r["kind"], variant=r.get("variant"))
                for r in self.records if not r.get("skipped") for f in r.get("freezes", ())]

    def counts(self) -> dict[str, int]:
        return dict(Counter(r["kind"] for r in self.records if not r.get("skipped")))

    def planned(self) -> list[dict[str, Any]]:
        return [asdict(p) for p in self.schedule]

    # -- The faults --------------------------------------------------------------------------

    def _inject(self, f: Planned) -> None:
        getattr(self, "_" + f.kind)(f)

    def _pick(self, candidates: list[int], f: Planned) -> int:
        return candidates[f.pick % len(candidates)]

    def _freeze(self, i: int) -> dict[str, Any]:
        slot = self.pool.slots[i]
        self.pool.pause(i)
        return {"worker": slot.name, "incarnation": slot.incarnation, "frozen_up": uptime(),
                "t": time.monotonic()}

    def _thaw(self, i: int, freeze: dict[str, Any]) -> dict[str, Any]:
        self.pool.resume(i)
        t = freeze.pop("t")
        freeze["resumed_up"] = uptime()
        freeze["frozen_s"] = round(time.monotonic() - t, 3)
        return freeze

    def _fresh(self, state: str | tuple[str, ...], fresh: float, timeout: float,
               exclude: tuple[int, ...] = (), near: set[str] | None = None) -> list[int]:
        """Workers whose last event is one of ``state``, logged within ``fresh`` s (waiting up
        to ``timeout``), in an operation on the workload's own locks (``_own``); with ``near``,
        only those whose accounts overlap it (``_accounts``)."""
        states = (state,) if isinstance(state, str) else state
        return self._wait_until(lambda: [i for st in states for i in
                                         self.pool.candidates(st, exclude=exclude, fresh=fresh)
                                         if self._own(i) and self._overlaps(i, near)],
                                timeout=timeout) or []

    def _own(self, i: int) -> bool:
        """Whether worker ``i``'s last event belongs to an operation on the workload's own
        locks, not a near operation (``chaos.near``: a neighbour lock that no frozen holder's
        successor raises, so freezing it would test nothing)."""
        return "near" not in (self.pool.slots[i].last_rec or {})

    def _accounts(self, i: int) -> set[str] | None:
        """The accounts worker ``i`` holds (``transfer`` workload: from the ``fences`` of its
        grant or the ``balances`` of its read), None when its last event names none."""
        rec = self.pool.slots[i].last_rec or {}
        if isinstance(rec.get("balances"), dict):
            return set(rec["balances"])
        if isinstance(rec.get("fences"), dict):
            return {_key(name) for name in rec["fences"]}
        return None

    def _overlaps(self, i: int, near: set[str] | None) -> bool:
        """Whether worker ``i`` may write what ``near`` names: the combined faults pair a
        frozen transfer with a newer holder of one of ITS accounts (else nothing races)."""
        if near is None:
            return True
        mine = self._accounts(i)
        return mine is None or bool(mine & near)

    def _pause(self, f: Planned) -> None:
        """Freeze a worker that has just read (within 50 ms, so before its first renewal, its
        lease runs out about one TTL later), keep it frozen more than a TTL, then resume it
        while another worker sits between its read and its write. ``race`` variant: resume as
        soon as that is possible, racing the first holder after it (nobody else has committed
        yet), which is held frozen until the thawed write is answered. ``late`` variant: frozen 2 x TTL + 0.3..1 s, several holders may have come and
        gone. ``edge``: thawed TTL -150..+150 ms after the freeze, whoever holds the lock.
        Pauses take ``pause_variants`` in turn (the runner: race, late, edge, ...; only race
        for ``unfenced-read``, whose window only the first holder after the frozen one opens)."""
        start = self._now()
        fresh = self._fresh("read", 0.05, 3.0)
        candidates = fresh or self.pool.candidates()
        if not candidates:
            self._record("pause", start, None, skipped=True)
            return
        i = self._pick(candidates, f)
        variant = self.pause_variants[self._pauses % len(self.pause_variants)]
        self._pauses += 1
        freeze = self._freeze(i)
        acks_before = self.pool.acks(exclude=[i])
        other = None
        if variant == "edge":
            self._halt.wait(max(0.0, self.ttl + (f.pick % 300 - 150) / 1000))
        else:
            self._halt.wait(self.ttl + 0.05 if variant == "race" else f.duration)
            near = self._accounts(i)
            other = self._wait_until(lambda: [j for j in self.pool.candidates("read", exclude=[i])
                                              if self._overlaps(j, near)],
                                     timeout=2 * self.ttl + 2.0)
        committed_meanwhile = self.pool.acks(exclude=[i]) - acks_before
        held = None
        if variant == "race" and other:
            # the race, decided: the reader between its read and its write waits (frozen) until
            # the thawed holder's write has its answer (a quarter TTL at most: the reader's
            # lease must not lapse), so that write lands inside the reader's window on a loaded
            # machine too (a thawed process is slow to be scheduled)
            held = other[0], self._freeze(other[0])
        thawed = self._thaw(i, freeze)
        if held is not None:  # not a revived holder: its lease does not lapse (not in freezes)
            self._wait_until(lambda: self.pool.last_event(i) not in _WRITING,
                             timeout=self.ttl / 4)
            held = self._thaw(*held)
        self._record("pause", start, self.pool.slots[i].name, variant=variant,
                     after_read=bool(fresh), resumed_while_other_read=bool(other),
                     others_committed_meanwhile=committed_meanwhile, freezes=[thawed],
                     reader_held=held)

    def _pause_grant(self, f: Planned) -> None:
        """Freeze a worker right after its grant (before any claim; a blind writer preferred:
        its think time has passed when it wakes, so it writes at once) past its TTL; thaw it
        within 30 ms of another worker's acknowledged blind batch (or after 2 x TTL + 4 s).
        Under a multi-lock workload: within 30 ms of the first write acknowledged on one of
        its accounts (blind or not: the record's ``after_blind`` says)."""
        start = self._now()
        found = self._fresh("blind", 0.03, 3.0) or self._fresh("acquired", 0.03, 1.0)
        if not found:
            self._record("pause_grant", start, None, skipped=True)
            return
        i = self._pick(found, f)
        near = self._accounts(i)
        freeze = self._freeze(i)
        self._halt.wait(self.ttl + 0.05)

        def acked(j: int) -> dict:
            return self.pool.slots[j].last_ack or {}

        def blind(j: int) -> bool:
            return acked(j).get("via") in ("batch", "sql") and "mark" in acked(j)

        def blind_batch_acked() -> list[int]:
            if near is None:  # one lock: the next blind batch of whoever holds it now
                return [j for j in self.pool.recent_acks(exclude=[i], fresh=0.03) if blind(j)]
            # several locks: the first write acknowledged on one of ours, whatever it was
            # (a claim after the freeze would have raised the shared lock anyway)
            return [j for j in self.pool.recent_acks(exclude=[i], fresh=0.03)
                    if near & {_key(n) for n in acked(j).get("fences", {})}]

        other = self._wait_until(blind_batch_acked, timeout=2 * self.ttl + 4.0)
        self._record("pause_grant", start, self.pool.slots[i].name,
                     resumed_after_other_ack=bool(other),
                     after_blind=bool(other) and blind(other[0]),
                     freezes=[self._thaw(i, freeze)])

    def _pause_write(self, f: Planned) -> None:
        """Freeze a worker whose write request is in flight (logged within 20 ms)."""
        start = self._now()
        found = self._fresh("write", 0.02, 3.0)
        if not found:
            self._record("pause_write", start, None, skipped=True)
            return
        i = self._pick(found, f)
        freeze = self._freeze(i)
        self._halt.wait(f.duration)
        self._record("pause_write", start, self.pool.slots[i].name,
                     freezes=[self._thaw(i, freeze)])

    def _handoff(self, f: Planned) -> None:
        """Freeze A (after its read or grant, about to send a batch); once its lease ran out
        and B was granted, freeze B before its claim (or blind write), thaw A, and thaw B
        2.5 x the database delay after A's write left (0..40 ms with no relay), 4.5 x after an
        rmw's batch: that one carries an Idempotency-Key, whose record the proxy claims first
        (one more round trip before the fence check; thawed earlier, B's claim would land before
        A's check and simply refuse A)."""
        start = self._now()

        def about_to_batch() -> list[int]:  # only a multi-statement write has two steps
            return [i for st in ("read", "blind")
                    for i in self.pool.candidates(st, fresh=0.05)
                    if (self.pool.slots[i].last_rec or {}).get("via") == "batch"
                    and self._own(i)]

        found = self._wait_until(about_to_batch, timeout=5.0)
        if not found:
            self._record("handoff", start, None, skipped=True)
            return
        a = self._pick(found, f)
        keyed = (self.pool.slots[a].last_rec or {}).get("ev") == "read"  # FencedSession.batch
        fa = self._freeze(a)
        # the first grant after A's lease ran out (caught within 30 ms, before its claim)
        granted = self._fresh(("acquired", "blind"), 0.03, 2 * self.ttl + 2.0, exclude=(a,),
                              near=self._accounts(a))
        if not granted:
            self._record("handoff", start, self.pool.slots[a].name, partner=None,
                         freezes=[self._thaw(a, fa)])
            return
        b = granted[0]
        fb = self._freeze(b)
        delay = 0.03 + (f.pick % 220) / 1000
        slowed = self.services.set_db_delay(delay)
        thawed_a = self._thaw(a, fa)
        wrote = self._fresh("write", 1.0, 1.5 + 4 * delay, exclude=(b,))
        # B's claim should reach the database after A's fence check (one round trip, 2 x delay,
        # after the key's claim if any) and before A's write commits (three more): thaw B about
        # 2.5 x delay after A's send, plus a round trip for a keyed batch.
        self._halt.wait((4.5 if keyed else 2.5) * delay if slowed else (f.pick % 40) / 1000)
        thawed_b = self._thaw(b, fb)
        self._halt.wait(4 * delay if slowed else 0.0)
        self.services.set_db_delay(0.0)
        self._record("handoff", start, self.pool.slots[a].name,
                     partner=self.pool.slots[b].name, a_wrote=a in wrote, keyed=keyed,
                     db_delay=delay if slowed else None, freezes=[thawed_a, thawed_b])

    def _kill_after_read(self, f: Planned) -> None:
        """Freeze A after its read; once B (granted after A's lease ran out) has claimed and
        read, SIGKILL B before it writes; thaw A; restart B."""
        start = self._now()
        found = self._fresh("read", 0.05, 3.0)
        if not found:
            self._record("kill_after_read", start, None, skipped=True)
            return
        a = self._pick(found, f)
        fa = self._freeze(a)
        # the first reader after A's lease ran out: B holds the fence right above A's
        reader = self._fresh("read", 0.05, 2 * self.ttl + 2.0, exclude=(a,),
                             near=self._accounts(a))
        b = reader[0] if reader else None
        if b is not None:
            self.pool.kill(b)
            # B's read must stand provably before A's write in the logs (uptime has 10 ms steps
            # and the checker a slack of UP_SLACK_S): only then does a write that the fence let
            # through count as stale
            self._halt.wait(0.05)
        thawed = self._thaw(a, fa)
        self._halt.wait(0.3)
        if b is not None:
            self.pool.respawn(b)
        self._record("kill_after_read", start, self.pool.slots[a].name,
                     killed=self.pool.slots[b].name if b is not None else None,
                     freezes=[thawed])

    def _pause_shared(self, f: Planned) -> None:
        """Freeze an exclusive holder right after its read or grant (the ``rw`` workload's
        writers), past its TTL; thaw it 50 ms after another worker's fenced read answered under
        a shared lease whose epoch is at least the frozen fence (caught within 30 ms; 50 ms so
        that the read stands provably before the write in the logs), or after 2 x TTL + 4 s."""
        start = self._now()

        def writers() -> list[int]:
            return [i for st in ("read", "blind") for i in self.pool.candidates(st, fresh=0.05)
                    if (self.pool.slots[i].last_rec or {}).get("mode") != "shared"
                    and self._own(i)]

        found = self._wait_until(writers, timeout=3.0)
        if not found:
            self._record("pause_shared", start, None, skipped=True)
            return
        i = self._pick(found, f)
        fence = int((self.pool.slots[i].last_rec or {}).get("fence") or 0)
        freeze = self._freeze(i)
        self._halt.wait(self.ttl + 0.05)

        def read_shared() -> list[int]:
            return [j for j in self.pool.recent_observes(exclude=[i], fresh=0.03)
                    if int((self.pool.slots[j].last_observe or {}).get("fence") or 0) >= fence]

        other = self._wait_until(read_shared, timeout=2 * self.ttl + 4.0)
        if other:  # the read stands provably before the thawed write in the logs (10 ms steps)
            self._halt.wait(0.05)
        self._record("pause_shared", start, self.pool.slots[i].name, fence=fence,
                     resumed_after_shared_read=bool(other), freezes=[self._thaw(i, freeze)])

    def _stop_proxy(self, f: Planned) -> None:
        """SIGSTOP the proxy with a write in flight (when one is caught), past a TTL."""
        start = self._now()
        writing = self._fresh("write", 0.02, 2.0)
        self.services.stop_proxy()
        self._halt.wait(f.duration)
        self.services.cont_proxy()
        self._record("stop_proxy", start, "proxy", write_in_flight=bool(writing),
                     stopped_s=round(self._now() - start, 3))

    def _db_delay(self, f: Planned) -> None:
        start = self._now()
        delay = 0.03 + (f.pick % 220) / 1000
        if not self.services.set_db_delay(delay):
            self._record("db_delay", start, None, skipped=True)
            return
        self._halt.wait(f.duration)
        self.services.set_db_delay(0.0)
        self._record("db_delay", start, "relay", delay_s=delay)

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
