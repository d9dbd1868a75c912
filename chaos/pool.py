"""The worker processes of a run: start, freeze, kill, restart (optionally under faketime).

Each slot (``w1``, ``w2``, …) runs one worker process at a time; every (re)start is a new
*incarnation* with its own log ``<logdir>/<name>.<incarnation>.jsonl`` (and ``.err`` for its
stderr), so a killed process's torn last line never mixes with its successor's. The pool tails
the current log to know what each worker is doing (``last_event``: ``read`` means it holds the
lock, has read and is thinking: the moment the nemesis freezes it).

Clock skew runs a worker under libfaketime (Debian's ``faketime`` package) with ``LD_PRELOAD``
and ``FAKETIME`` set directly, not through the ``faketime`` wrapper, so signals reach the
Python process itself. libfaketime creates a shared-memory segment per process and unlinks it
only on a clean exit; the pool removes those of skewed workers it killed.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["faketime_lib", "Slot", "WorkerPool"]

_FAKETIME_GLOBS = ("/usr/lib/*/faketime/libfaketime.so.1", "/usr/lib/faketime/libfaketime.so.1",
                   "/usr/local/lib/faketime/libfaketime.so.1")


def faketime_lib() -> str | None:
    """Path of libfaketime (``apt-get install faketime``), or None when it is not installed."""
    for pattern in _FAKETIME_GLOBS:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


@dataclass
class Slot:
    index: int
    name: str
    proc: subprocess.Popen | None = None
    incarnation: int = -1
    skew: dict[str, str] | None = None
    """The ``FAKETIME*`` variables of the current incarnation (None: real clock)."""
    log_path: Path | None = None
    offset: int = 0
    pending: bytes = b""
    last: str | None = None
    last_rec: dict | None = None
    """The last event in full (e.g. an ``ack``'s ``via``)."""
    last_seen: float = 0.0
    """``time.monotonic()`` when the pool first saw ``last``."""
    acks: int = 0
    """Acknowledged writes seen in this slot's logs (all incarnations)."""
    last_ack: dict | None = None
    """The last ``ack`` event in full, and when the pool first saw it (``last_ack_seen``): a
    worker logs its next events within milliseconds, so ``last`` is rarely still the ack."""
    last_ack_seen: float = 0.0
    last_observe: dict | None = None
    """The last ``observe`` (a reader's answered fenced read), and when the pool first saw it
    (``last_observe_seen``): the reader releases right after, so ``last`` rarely shows it."""
    last_observe_seen: float = 0.0
    paused: bool = False
    busy: bool = False
    """Being replaced (a skew change): no other fault touches it meanwhile."""
    expect_down: bool = False
    """Killed on purpose and not yet restarted: the supervisor leaves it alone."""


class WorkerPool:
    """``n`` worker slots running ``argv`` (+ per-incarnation flags) in ``cwd``."""

    def __init__(self, n: int, argv: Sequence[str], logdir: Path, cwd: Path):
        self.argv = list(argv)
        self.logdir = logdir
        self.cwd = cwd
        self.slots = [Slot(i, f"w{i + 1}") for i in range(n)]
        self.crashes: list[dict] = []
        self._mutex = threading.RLock()

    # -- processes ---------------------------------------------------------------------------

    def _spawn(self, slot: Slot) -> None:
        slot.incarnation += 1
        slot.log_path = self.logdir / f"{slot.name}.{slot.incarnation}.jsonl"
        slot.offset, slot.pending, slot.last = 0, b"", None
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("FAKETIME") and k != "LD_PRELOAD"}
        env.update(slot.skew or {})
        argv = [*self.argv, "--worker", slot.name, "--incarnation", str(slot.incarnation),
                "--log", str(slot.log_path)]
        with open(self.logdir / f"{slot.name}.{slot.incarnation}.err", "ab") as err:
            slot.proc = subprocess.Popen(argv, cwd=self.cwd, env=env, stdout=subprocess.DEVNULL,
                                         stderr=err, start_new_session=True)
        slot.paused = slot.expect_down = False

    def start_all(self) -> None:
        self.logdir.mkdir(parents=True, exist_ok=True)
        with self._mutex:
            for slot in self.slots:
                self._spawn(slot)

    @staticmethod
    def _reaped(slot: Slot) -> None:
        """After a skewed worker ended: remove libfaketime's per-process shared memory, which it
        unlinks only on a clean exit (a stale one would break a later process with that pid).
        Harmless when it is already gone."""
        if slot.skew and slot.proc is not None:
            for name in (f"faketime_shm_{slot.proc.pid}", f"sem.faketime_sem_{slot.proc.pid}"):
                with contextlib.suppress(OSError):
                    os.unlink(f"/dev/shm/{name}")

    @staticmethod
    def _running(slot: Slot) -> bool:
        return slot.proc is not None and slot.proc.poll() is None

    def pause(self, i: int) -> None:
        with self._mutex:
            slot = self.slots[i]
            if self._running(slot):
                os.kill(slot.proc.pid, signal.SIGSTOP)
                slot.paused = True

    def resume(self, i: int) -> None:
        with self._mutex:
            slot = self.slots[i]
            if self._running(slot):
                os.kill(slot.proc.pid, signal.SIGCONT)
            slot.paused = False

    def kill(self, i: int) -> None:
        """SIGKILL (a crash mid-operation); ``respawn`` brings it back."""
        with self._mutex:
            slot = self.slots[i]
            slot.expect_down = True
            if self._running(slot):
                os.kill(slot.proc.pid, signal.SIGKILL)
                slot.proc.wait(10)
                self._reaped(slot)
            slot.paused = False

    def respawn(self, i: int) -> None:
        with self._mutex:
            if not self._running(self.slots[i]):
                self._spawn(self.slots[i])

    def _terminate(self, slot: Slot, timeout: float) -> None:
        if not self._running(slot):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(slot.proc.pid, signal.SIGCONT)
            os.kill(slot.proc.pid, signal.SIGTERM)
        try:
            slot.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(slot.proc.pid, signal.SIGKILL)
            slot.proc.wait(10)
        self._reaped(slot)  # also a SIGTERM that came before the handler was installed

    def replace(self, i: int, skew: dict[str, str] | None, timeout: float = 4.0) -> None:
        """Stop worker ``i`` (SIGTERM: it finishes its operation) and start it with ``skew``.

        Holds the pool for the whole swap (up to ``timeout`` s), so no other fault sees a
        half-replaced slot and no process is ever left untracked."""
        with self._mutex:
            slot = self.slots[i]
            slot.busy = True
            try:
                self._terminate(slot, timeout)
                slot.skew = skew
                self._spawn(slot)
            finally:
                slot.busy = False

    def supervise(self) -> None:
        """Restart any worker that died without the nemesis killing it (recorded as a crash)."""
        with self._mutex:
            for slot in self.slots:
                if slot.proc is None or slot.expect_down or slot.busy or self._running(slot):
                    continue
                err = self.logdir / f"{slot.name}.{slot.incarnation}.err"
                tail = err.read_text(errors="replace")[-2000:] if err.exists() else ""
                self.crashes.append({"worker": slot.name, "incarnation": slot.incarnation,
                                     "returncode": slot.proc.returncode, "stderr": tail})
                self._reaped(slot)
                self._spawn(slot)

    def stop_all(self, timeout: float = 8.0) -> None:
        with self._mutex:
            for slot in self.slots:
                slot.expect_down = True
        threads = [threading.Thread(target=self._terminate, args=(s, timeout)) for s in self.slots]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    # -- what the workers are doing ----------------------------------------------------------

    def last_event(self, i: int) -> str | None:
        """The last event worker ``i``'s current incarnation logged (reads what was appended)."""
        slot = self.slots[i]
        if slot.log_path is None:
            return None
        try:
            with open(slot.log_path, "rb") as fh:
                fh.seek(slot.offset)
                data = fh.read()
        except FileNotFoundError:
            return None
        if data:
            slot.offset += len(data)
            lines = (slot.pending + data).split(b"\n")
            slot.pending = lines.pop()
            for line in lines:
                with contextlib.suppress(ValueError):
                    slot.last_rec = json.loads(line)
                    slot.last = slot.last_rec.get("ev")
                    slot.last_seen = time.monotonic()
                    slot.acks += slot.last == "ack"
                    if slot.last == "ack":
                        slot.last_ack, slot.last_ack_seen = slot.last_rec, slot.last_seen
                    elif slot.last == "observe":
                        slot.last_observe = slot.last_rec
                        slot.last_observe_seen = slot.last_seen
        return slot.last

    def candidates(self, state: str | None = None, exclude: Sequence[int] = (),
                   fresh: float | None = None) -> list[int]:
        """Running, unpaused, not busy workers (whose last event is ``state``, if given, and was
        first seen at most ``fresh`` seconds ago, if given)."""
        with self._mutex:
            out = []
            now = time.monotonic()
            for slot in self.slots:
                if slot.index in exclude or slot.paused or slot.busy or slot.expect_down:
                    continue
                if not self._running(slot):
                    continue
                if state is not None and self.last_event(slot.index) != state:
                    continue
                if fresh is not None and now - slot.last_seen > fresh:
                    continue
                out.append(slot.index)
            return out

    def recent_acks(self, exclude: Sequence[int] = (), fresh: float = 0.03) -> list[int]:
        """Running, unpaused workers whose last ``ack`` was first seen at most ``fresh`` s ago
        (``slots[i].last_ack``: the event), whatever they logged since."""
        with self._mutex:
            now = time.monotonic()
            out = []
            for slot in self.slots:
                if slot.index in exclude or slot.paused or not self._running(slot):
                    continue
                self.last_event(slot.index)
                if slot.last_ack is not None and now - slot.last_ack_seen <= fresh:
                    out.append(slot.index)
            return out

    def recent_observes(self, exclude: Sequence[int] = (), fresh: float = 0.03) -> list[int]:
        """Running, unpaused workers whose last ``observe`` was first seen at most ``fresh`` s
        ago (``slots[i].last_observe``: the event)."""
        with self._mutex:
            now = time.monotonic()
            out = []
            for slot in self.slots:
                if slot.index in exclude or slot.paused or not self._running(slot):
                    continue
                self.last_event(slot.index)
                if slot.last_observe is not None and now - slot.last_observe_seen <= fresh:
                    out.append(slot.index)
            return out

    def acks(self, exclude: Sequence[int] = ()) -> int:
        """Acknowledged writes seen so far in the logs of every slot but ``exclude``."""
        with self._mutex:
            for slot in self.slots:
                self.last_event(slot.index)
            return sum(s.acks for s in self.slots if s.index not in exclude)

    def log_paths(self) -> list[Path]:
        return sorted(self.logdir.glob("*.jsonl"))
