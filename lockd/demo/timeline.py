"""The demo's timeline: what happened, when, to whom, under which fence, with which HTTP result.

Workers are separate processes; each prints one JSON object per line on stdout (``Event.to_json``)
with ``t`` already measured against the demo's origin: ``time.monotonic()`` is the system-wide
``CLOCK_MONOTONIC`` on Linux, so the parent passes its origin (``--t0``) and every process measures
against the same clock. The director adds its own events (signals sent, lease lapsed) to the same
timeline. ``Timeline`` is thread-safe: one reader thread per worker feeds it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

__all__ = ["Event", "Timeline", "format_event", "format_header", "format_table", "write_event"]


@dataclass(frozen=True)
class Event:
    """One line of the timeline.

    ``t`` is seconds since the demo started; ``worker`` names the actor (``"demo"`` for the
    director); ``event`` is a short slug (``acquired``, ``write``, ``write_rejected``…); ``fence``
    is the fence the actor held, if any; ``http`` the HTTP result it got (``"201"``,
    ``"409 stale_token"``…); ``detail`` a human note; ``data`` machine-readable extras.
    """

    t: float
    worker: str
    event: str
    fence: int | None = None
    http: str | None = None
    detail: str = ""
    scene: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> Event:
        """Parse one worker line; raises ``ValueError`` on anything that is not an event."""
        raw = json.loads(line)
        if not isinstance(raw, dict) or not {"t", "worker", "event"} <= raw.keys():
            raise ValueError(f"not an event: {line!r}")
        known = {k: raw[k] for k in cls.__dataclass_fields__ if k in raw}
        return cls(**known)


class Timeline:
    """Events of one demo run, in arrival order; ``events()`` returns them sorted by time.

    ``origin`` is the ``time.monotonic()`` value that is t = 0. ``listener`` (optional) is called
    with each event as it is added, from whichever thread added it.
    """

    def __init__(self, origin: float | None = None,
                 listener: Callable[[Event], None] | None = None):
        self.origin = time.monotonic() if origin is None else origin
        self._events: list[Event] = []
        self._cond = threading.Condition()
        self._listener = listener

    def now(self) -> float:
        """Seconds since the origin."""
        return time.monotonic() - self.origin

    def add(self, event: Event) -> Event:
        with self._cond:
            self._events.append(event)
            self._cond.notify_all()
        if self._listener is not None:
            self._listener(event)
        return event

    def note(self, worker: str, event: str, *, scene: str = "", fence: int | None = None,
             http: str | None = None, detail: str = "", **data: Any) -> Event:
        """Add an event that happens now (used by the director)."""
        return self.add(Event(round(self.now(), 3), worker, event, fence, http, detail, scene,
                              data))

    def events(self, scene: str | None = None) -> list[Event]:
        """A sorted copy (by ``t``, stable), optionally only one scene's events."""
        with self._cond:
            items = list(self._events)
        if scene is not None:
            items = [e for e in items if e.scene == scene]
        return sorted(items, key=lambda e: e.t)

    def wait_for(self, scene: str, worker: str, event: str, timeout: float,
                 alive: Callable[[], bool] | None = None) -> Event | None:
        """The first ``event`` from ``worker`` in ``scene``, waiting up to ``timeout`` seconds.

        Returns ``None`` on timeout, or early once ``alive()`` turns false (the worker exited
        without saying it): a dead worker will never send it.
        """
        def first() -> Event | None:
            for e in self._events:
                if e.scene == scene and e.worker == worker and e.event == event:
                    return e
            return None

        deadline = time.monotonic() + timeout
        with self._cond:
            while (found := first()) is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                if alive is not None and not alive():
                    # One last wait: the reader may still be delivering the final lines.
                    self._cond.wait(min(remaining, 0.3))
                    return first()
                self._cond.wait(min(remaining, 0.05))
            return found


_COLUMNS = "{t:>7}  {worker:<6} {fence:>5}  {http:<17} {event}"


def format_header() -> str:
    return _COLUMNS.format(t="t (s)", worker="worker", fence="fence", http="HTTP",
                           event="event")


def format_event(e: Event) -> str:
    """One readable line: seconds since start, actor, fence, HTTP result, what happened."""
    return _COLUMNS.format(t=f"{e.t:.3f}", worker=e.worker,
                           fence="" if e.fence is None else e.fence, http=e.http or "",
                           event=e.detail or e.event.replace("_", " ")).rstrip()


def format_table(rows: Iterable[dict[str, Any]], columns: list[str]) -> str:
    """A plain text table of ``rows`` with the given ``columns`` (values via ``str``)."""
    rows = list(rows)
    cells = [[("" if r.get(c) is None else str(r.get(c))) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    line = "  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))
    rule = "  ".join("-" * w for w in widths)
    body = ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
            for row in cells]
    return "\n".join([line.rstrip(), rule, *body])


def write_event(stream: TextIO, event: Event) -> None:
    """Print one event as a JSON line and flush (workers call this; the parent reads it)."""
    stream.write(event.to_json() + "\n")
    stream.flush()

