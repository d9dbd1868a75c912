"""The three scenes of the demo, played with real worker processes, and what each must show.

1. ``happy``: A acquires with a short TTL, works longer than the TTL while renewing in the
   background, writes through the proxy and releases; B, already waiting, acquires at once.
2. ``crash``: A is killed with SIGKILL while holding; B, waiting, takes over when A's lease
   lapses, with a higher fence, without anyone's help.
4. ``file`` (``lockd.demo.files``): scene 3 with an output FILE (a fenced object) in place
   of rows: A's late file write is refused and B's file stands.
3. ``revived``: A is frozen with SIGSTOP past its lease; lockd expires it; B acquires with a higher
   fence and writes; A is resumed with SIGCONT, sends its next write with its old token and the
   proxy rejects it with 409 ``stale_token``. B's work is unaffected; A's write left no trace.

Each scene returns a ``SceneResult``: a list of named checks (each ok or not, with the measured
numbers) and the facts a test asserts on (fences, HTTP results, the scene's rows). The director
waits on workers' events with bounded timeouts, so a misbehaving service fails a check instead of
hanging the demo.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

from lockd.client.fenced import FencedSession
from lockd.common.tls import client_context
from lockd.demo.certs import DemoTLS
from lockd.demo.procs import ChildSet
from lockd.demo.table import TABLE
from lockd.demo.timeline import Event, Timeline

__all__ = ["Check", "Director", "SceneResult", "SCENES", "happy_path", "crash_path",
           "revived_holder"]

STARTUP_TIMEOUT = 15.0
"""Seconds a worker may take to start and acquire a free lock (Python start-up on a busy box)."""


@dataclass
class Check:
    """One claim a scene makes about what happened, and whether it held."""

    name: str
    ok: bool
    detail: str = ""


@dataclass
class SceneResult:
    """The outcome of one scene: ``ok`` iff every check held."""

    scene: str
    title: str
    checks: list[Check] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append(Check(name, bool(ok), detail))
        return bool(ok)

    def to_json(self) -> dict[str, Any]:
        return {"scene": self.scene, "title": self.title, "ok": self.ok,
                "checks": [asdict(c) for c in self.checks], "facts": self.facts}


class Worker:
    """A worker process of one scene: its events go to the timeline, its stderr is kept."""

    def __init__(self, director: Director, scene: str, name: str, argv: list[str]):
        self.director, self.scene, self.name = director, scene, name
        self.proc = director.children.spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.stderr: list[str] = []
        self._threads = [
            threading.Thread(target=self._read_events, daemon=True, name=f"events-{name}"),
            threading.Thread(target=self._read_stderr, daemon=True, name=f"stderr-{name}"),
        ]
        for t in self._threads:
            t.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read_events(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").strip()
            if not line:
                continue
            try:
                event = Event.from_json(line)
            except ValueError:
                self.stderr.append(line)
                continue
            self.director.timeline.add(event)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self.stderr.append(raw.decode(errors="replace").rstrip())

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_event(self, event: str, timeout: float) -> Event | None:
        """This worker's first ``event``, or ``None`` after ``timeout`` s / once it died silent."""
        return self.director.timeline.wait_for(self.scene, self.name, event, timeout,
                                               self.alive)

    def events(self, event: str) -> list[Event]:
        return [e for e in self.director.timeline.events(self.scene)
                if e.worker == self.name and e.event == event]

    def signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(sig)

    def wait_exit(self, timeout: float) -> int | None:
        """The exit status (negative: killed by that signal), or ``None`` if still running."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        for t in self._threads:
            t.join(2.0)
        return code

    def diagnostics(self) -> str:
        tail = [line for line in self.stderr if line][-8:]
        return f"{self.name} (pid {self.pid}) stderr: " + " | ".join(tail) if tail else ""


class Director:
    """Starts workers, sends them signals, asks lockd and the proxy what they see.

    ``ttl`` (seconds) is every worker's lease TTL; ``run`` the run id that keys this run's rows.
    """

    def __init__(self, lockd_url: str, proxy_url: str, *, run: str, ttl: float,
                 timeline: Timeline, children: ChildSet, tls: DemoTLS | None = None):
        self.lockd_url = lockd_url.rstrip("/")
        self.proxy_url = proxy_url.rstrip("/")
        self.run = run
        self.ttl = ttl
        self.timeline = timeline
        self.children = children
        self.tls = tls
        verify = client_context(tls.ca, tls.client) if tls else True
        self.http = httpx.Client(timeout=5.0, verify=verify)
        self.workers: list[Worker] = []

    def close(self) -> None:
        self.http.close()

    def table_lock(self) -> str:
        """The lock that writes the demo's table, as the proxy names it (one row, one lock: the
        proxy decides; without a policy, table ``demo_writes`` is written under lock
        ``demo_writes``). The scenes run one after another, so they share it."""
        lock = FencedSession(self.proxy_url, http_client=self.http).lock_for(TABLE)
        if lock is None:
            raise RuntimeError(f"the proxy writes {TABLE} unfenced: nothing to demonstrate")
        return lock

    def worker(self, scene: str, name: str, lock: str, *, wait: float = 0.0, writes: int = 1,
               work: float = 0.0, hold: float = 0.0, object_key: str | None = None) -> Worker:
        """Start worker ``name`` (a new process) for ``lock``; see ``lockd.demo.worker``
        (``object_key``: each write is that output file of bucket ``lock``, not a row)."""
        argv = [sys.executable, "-m", "lockd.demo.worker",
                "--lockd-url", self.lockd_url, "--proxy-url", self.proxy_url,
                "--name", name, "--scene", scene, "--lock", lock, "--run", self.run,
                "--t0", repr(self.timeline.origin), "--ttl", repr(self.ttl),
                "--wait", repr(wait), "--writes", str(writes), "--work", repr(work),
                "--hold", repr(hold), "--parent-pid", str(os.getpid())]
        if object_key is not None:
            argv += ["--object", object_key]
        if self.tls is not None:
            argv += ["--ca", str(self.tls.ca), "--cert", str(self.tls.client_cert),
                     "--key", str(self.tls.client_key)]
        w = Worker(self, scene, name, argv)
        self.workers.append(w)
        return w

    def note(self, scene: str, event: str, detail: str, **kw: Any) -> Event:
        return self.timeline.note("demo", event, scene=scene, detail=detail, **kw)

    def lock_status(self, lock: str) -> dict[str, Any] | None:
        """lockd's view of ``lock`` (``GET /v1/locks/{name}``), ``None`` if it did not answer."""
        try:
            r = self.http.get(f"{self.lockd_url}/v1/locks/{quote(lock, safe='/:')}")
            return r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    def poll_lock(self, lock: str, until: Callable[[dict[str, Any]], bool],
                  timeout: float) -> dict[str, Any] | None:
        """Poll lockd every 20 ms until ``until(status)``; the status, or ``None`` on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.lock_status(lock)
            if status is not None and until(status):
                return status
            time.sleep(0.02)
        return None

    def rows(self, scene: str | None = None) -> list[dict[str, Any]] | None:
        """This run's rows as the proxy serves them (an unfenced read), ``None`` on failure."""
        try:
            r = self.http.get(f"{self.proxy_url}/v1/tables/{TABLE}/rows",
                              params={"run": self.run, "limit": 1000})
            if r.status_code != 200:
                return None
            items = r.json()["items"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None
        items = [i for i in items if scene is None or i.get("scene") == scene]
        return sorted(items, key=lambda i: (_SCENE_ORDER.get(i.get("scene"), 9),
                                            i.get("fence") or 0, i.get("worker") or "",
                                            i.get("step") or 0))


def _first(events: list[Event], key: str) -> Any:
    """``data[key]`` of the first of ``events``, ``None`` if there is none."""
    return events[0].data.get(key) if events else None


def _http_of(e: Event | None) -> str | None:
    return e.http if e is not None else None


def _fence(e: Event | None) -> int | None:
    return e.fence if e is not None else None


def _finish(d: Director, s: SceneResult, workers: list[Worker], timeout: float) -> None:
    """Wait for the workers to exit (check it) and attach the scene's rows to the facts."""
    for w in workers:
        code = w.wait_exit(timeout)
        if code is None:
            s.check(f"{w.name} finishes", False, f"{w.name} still running after {timeout:g}s")
        s.facts.setdefault("exit", {})[w.name] = code
    rows = d.rows(s.scene)
    s.facts["rows"] = rows
    s.check("the scene's rows read back through the proxy", rows is not None)
    problems = [w.diagnostics() for w in workers if w.diagnostics()]
    if not s.ok and problems:
        s.facts["diagnostics"] = problems


def _writes(w: Worker) -> list[dict[str, Any]]:
    return [{"step": e.data.get("step"), "fence": e.fence, "http": e.http} for e in
            w.events("write")]


def happy_path(d: Director) -> SceneResult:
    """Scene 1: renew past the TTL, write, release; the waiter gets the lock at once."""
    ttl = d.ttl
    s = SceneResult("happy", "Happy path: A works past its TTL while renewing, writes, releases; "
                             "B, waiting, acquires at once")
    lock = d.table_lock()
    a = d.worker(s.scene, "A", lock, writes=3, work=0.9 * ttl, hold=0.6 * ttl)
    a_acq = a.wait_event("acquired", STARTUP_TIMEOUT)
    if not s.check("A acquires", a_acq is not None, f"fence {_fence(a_acq)}"):
        _finish(d, s, [a], 5)
        return s
    b = d.worker(s.scene, "B", lock, wait=10 + 4 * ttl, writes=1)
    a_rel = a.wait_event("released", STARTUP_TIMEOUT + 4 * ttl)
    b_acq = b.wait_event("acquired", 5 + ttl)
    _finish(d, s, [a, b], 10)

    b_asked = b.events("acquiring")
    a_writes, b_writes = _writes(a), _writes(b)
    b_rel = b.events("released")
    s.facts.update(fences={"A": _fence(a_acq), "B": _fence(b_acq)},
                   writes={"A": a_writes, "B": b_writes},
                   renewals={"A": len(a.events("renewed"))},
                   released={"A": _http_of(a_rel), "B": _http_of(b_rel[0] if b_rel else None)})
    s.check("A makes 3 writes, all accepted (201)",
            len(a_writes) == 3 and all(w["http"] == "201" for w in a_writes),
            f"{[w['http'] for w in a_writes]}")
    held = (a_rel.t - a_acq.t) if a_rel else None
    s.facts["a_held_s"] = held
    s.check("A holds longer than its TTL, renewing, and releases it (200)",
            a_rel is not None and held is not None and held > ttl and not a.events("lease_lost")
            and len(a.events("renewed")) >= 1,
            f"held {held:.2f}s with ttl {ttl:g}s, {len(a.events('renewed'))} renewals"
            if held is not None else "A did not release")
    s.check("B was waiting before A released",
            bool(b_asked) and a_rel is not None and b_asked[0].t < a_rel.t,
            f"B asked at {b_asked[0].t:.3f}s" if b_asked else "B never asked")
    gap = (b_acq.t - a_rel.t) if (b_acq and a_rel) else None
    s.facts["b_after_release_s"] = gap
    s.check("B acquires at once after the release (not at A's expiry)",
            gap is not None and 0 <= gap < min(0.5, ttl / 2),
            f"{gap * 1000:.0f} ms after A released" if gap is not None else "B did not acquire")
    s.check("B's fence is higher", b_acq is not None and a_acq is not None
            and b_acq.fence > a_acq.fence, f"{_fence(a_acq)} -> {_fence(b_acq)}")
    s.check("B's write is accepted (201)", [w["http"] for w in b_writes] == ["201"],
            f"{[w['http'] for w in b_writes]}")
    rows = s.facts.get("rows") or []
    s.check("the table holds exactly A's 3 and B's 1 rows",
            [(r["worker"], r["step"], r["fence"]) for r in rows]
            == [("A", 1, _fence(a_acq)), ("A", 2, _fence(a_acq)), ("A", 3, _fence(a_acq)),
                ("B", 1, _fence(b_acq))], f"{len(rows)} rows")
    return s


def crash_path(d: Director) -> SceneResult:
    """Scene 2: SIGKILL the holder; the waiter takes over once the lease lapses."""
    ttl = d.ttl
    s = SceneResult("crash", "Crash: A is killed with SIGKILL while holding; B, waiting, takes "
                             "over when A's lease lapses")
    lock = d.table_lock()
    a = d.worker(s.scene, "A", lock, writes=2, work=30.0)
    a_acq = a.wait_event("acquired", STARTUP_TIMEOUT)
    a_w1 = a.wait_event("write", 5) if a_acq else None
    if not s.check("A acquires and writes", a_acq is not None and a_w1 is not None,
                   f"fence {_fence(a_acq)}, write {_http_of(a_w1)}"):
        _finish(d, s, [a], 5)
        return s
    b = d.worker(s.scene, "B", lock, wait=10 + 4 * ttl, writes=1)
    waiting = b.wait_event("acquiring", STARTUP_TIMEOUT)
    queued = d.poll_lock(lock, lambda st: st.get("waiters", 0) >= 1, 5.0) if waiting else None
    s.check("B is waiting at lockd before the crash", queued is not None,
            f"waiters={queued.get('waiters')}" if queued else "no waiter seen")
    a.signal(signal.SIGKILL)
    kill = d.note(s.scene, "sigkill", f"SIGKILL A (pid {a.pid}): it never renews or releases")
    a_code = a.wait_exit(5)
    status = d.lock_status(lock) or {}
    a_still = bool(status.get("held")) and status.get("fence") == a_acq.fence
    left = status.get("ttl_ms", 0) / 1000 if a_still else 0.0
    seen = d.note(s.scene, "lease_left", f"lockd: A's lease still has {left:.2f}s to live"
                  if a_still else "lockd: A's lease is already gone", fence=a_acq.fence)
    b_acq = b.wait_event("acquired", ttl + 5)
    _finish(d, s, [b], 10)

    s.facts.update(fences={"A": _fence(a_acq), "B": _fence(b_acq)}, a_exit=a_code,
                   lease_left_s=left, writes={"A": _writes(a), "B": _writes(b)})
    s.facts["exit"]["A"] = a_code
    s.check("A died of SIGKILL", a_code == -signal.SIGKILL, f"exit status {a_code}")
    s.check("A never released", not a.events("released"))
    takeover = (b_acq.t - kill.t) if b_acq else None
    s.facts["takeover_after_kill_s"] = takeover
    expected = seen.t + left
    earliest = expected - 0.15 if a_still else kill.t
    s.check("B takes over when A's lease lapses, without help",
            b_acq is not None and earliest <= b_acq.t <= expected + 1.0,
            f"{takeover:.2f}s after the kill; lockd had said {left:.2f}s left"
            if takeover is not None else "B did not acquire")
    s.check("B's fence is higher", b_acq is not None and b_acq.fence > a_acq.fence,
            f"{_fence(a_acq)} -> {_fence(b_acq)}")
    s.check("B's write is accepted (201)", [w["http"] for w in _writes(b)] == ["201"],
            f"{[w['http'] for w in _writes(b)]}")
    rows = s.facts.get("rows") or []
    s.check("the table holds A's 1 and B's 1 rows",
            [(r["worker"], r["step"], r["fence"]) for r in rows]
            == [("A", 1, _fence(a_acq)), ("B", 1, _fence(b_acq))], f"{len(rows)} rows")
    return s


def revived_holder(d: Director) -> SceneResult:
    """Scene 3: SIGSTOP past the lease, a new holder writes, SIGCONT, the stale write gets 409."""
    ttl = d.ttl
    s = SceneResult("revived", "Revived holder: A freezes (SIGSTOP) past its lease; B acquires "
                               "and writes; A wakes (SIGCONT) and its write is rejected")
    lock = d.table_lock()
    a = d.worker(s.scene, "A", lock, writes=2, work=ttl)
    a_acq = a.wait_event("acquired", STARTUP_TIMEOUT)
    a_w1 = a.wait_event("write", 5) if a_acq else None
    if not s.check("A acquires and writes", a_acq is not None and a_w1 is not None,
                   f"fence {_fence(a_acq)}, write {_http_of(a_w1)}"):
        _finish(d, s, [a], 5)
        return s
    a.signal(signal.SIGSTOP)
    stop = d.note(s.scene, "sigstop", f"SIGSTOP A (pid {a.pid}): frozen mid-work, "
                                      "still believing it holds the lock")
    lapsed = d.poll_lock(lock, lambda st: not st.get("held"), ttl + 5)
    if lapsed is not None:
        d.note(s.scene, "lease_expired", "lockd: A's lease expired; the lock is free",
               fence=lapsed.get("fence"))
    s.check("lockd expires the frozen holder's lease", lapsed is not None)
    b = d.worker(s.scene, "B", lock, wait=5 + ttl, writes=2, work=1.5 * ttl)
    b_acq = b.wait_event("acquired", STARTUP_TIMEOUT)
    b_w1 = b.wait_event("write", 5) if b_acq else None
    time.sleep(max(0.0, stop.t + ttl + 0.2 - d.timeline.now()))  # frozen past a whole TTL
    a.signal(signal.SIGCONT)
    cont = d.note(s.scene, "sigcont", f"SIGCONT A after {d.timeline.now() - stop.t:.2f}s frozen: it "
                                      "finishes its step, then writes with its old token")
    rejected = a.wait_event("write_rejected", 5 + 2 * ttl)
    _finish(d, s, [a, b], 10 + 2 * ttl)

    stale = dict(rejected.data) if rejected else None
    s.facts.update(fences={"A": _fence(a_acq), "B": _fence(b_acq)},
                   frozen_s=cont.t - stop.t, stale=stale,
                   writes={"A": _writes(a), "B": _writes(b)},
                   a_released=bool(a.events("released")),
                   a_release_refused=_first(a.events("release_refused"), "code"))
    s.check("A was frozen longer than its TTL", cont.t - stop.t > ttl,
            f"{cont.t - stop.t:.2f}s frozen, ttl {ttl:g}s")
    s.check("B acquires with a higher fence while A is frozen",
            b_acq is not None and b_acq.fence > a_acq.fence and b_acq.t < cont.t,
            f"{_fence(a_acq)} -> {_fence(b_acq)}")
    s.check("B's first write is accepted (201) before A wakes",
            b_w1 is not None and b_w1.http == "201" and b_w1.t <= cont.t, _http_of(b_w1) or "none")
    s.check("A's write after waking is rejected: 409 stale_token",
            stale is not None and stale.get("status") == 409
            and stale.get("code") == "stale_token"
            and stale.get("presented") == _fence(a_acq) and stale.get("highest") == _fence(b_acq),
            f"presented {stale.get('presented')}, highest {stale.get('highest')}"
            if stale else "A's write was not rejected")
    s.check("A's release is refused: its lease was already gone",
            bool(a.events("release_refused")) and not a.events("released"),
            s.facts["a_release_refused"] or "")
    s.check("B's writes are all accepted (201)",
            [w["http"] for w in _writes(b)] == ["201", "201"],
            f"{[w['http'] for w in _writes(b)]}")
    rows = s.facts.get("rows") or []
    s.check("the table holds A's first write and B's two, nothing from A after B",
            [(r["worker"], r["step"], r["fence"]) for r in rows]
            == [("A", 1, _fence(a_acq)), ("B", 1, _fence(b_acq)), ("B", 2, _fence(b_acq))],
            f"{len(rows)} rows")
    return s


SCENES: list[Callable[[Director], SceneResult]] = [happy_path, crash_path, revived_holder]
"""The scenes of rows; ``lockd.demo.files.SCENES`` adds scene 4 (a file) after them."""
_SCENE_ORDER = {"happy": 0, "crash": 1, "revived": 2, "file": 3}

