"""Draws docs/img/timeline.svg: the revived-holder story on one time axis, as hand-built SVG.

Run ``python docs/timeline.py`` after changing the picture; ``tests/system/readme/test_timeline.py``
checks that the committed file is what this script writes, so the two cannot drift. No drawing
library and no network: the SVG is text built here, every coordinate an integer, so the output is
byte-for-byte reproducible.
"""

from __future__ import annotations

import sys
from html import escape
from pathlib import Path

OUT = Path(__file__).resolve().parent / "img" / "timeline.svg"

WIDTH, HEIGHT = 820, 330
LEFT, RIGHT = 150, 790  # the time axis, in pixels
LANES = {"worker A": 70, "lockd": 135, "worker B": 200, "proxy + table": 265}
GREEN, RED, GREY, BLUE, INK = "#2e7d32", "#c62828", "#9e9e9e", "#1565c0", "#212121"

# Moments on the axis (seconds of the story, 0..10).
T = {"a_grant": 0.3, "a_write": 1.2, "a_freeze": 2.0, "a_expiry": 3.9, "b_grant": 4.8,
     "b_write": 5.4, "a_thaw": 6.6, "a_write2": 7.4, "b_release": 9.4, "end": 10.0}


def x(t: float) -> int:
    """Pixel column of moment ``t`` (seconds, 0 to 10)."""
    return LEFT + round((RIGHT - LEFT) * t / T["end"])


def text(px: int, py: int, body: str, *, anchor: str = "middle", size: int = 12,
         fill: str = INK, weight: str = "normal") -> str:
    return (f'<text x="{px}" y="{py}" text-anchor="{anchor}" font-size="{size}" '
            f'font-weight="{weight}" fill="{fill}">{escape(body)}</text>')


def bar(t0: float, t1: float, lane: str, fill: str, label: str, *, dashed: bool = False,
        label_at: tuple[float, float] | None = None) -> str:
    """A span on a lane; the label is centred on ``label_at`` (default: the span itself)."""
    y = LANES[lane]
    style = ' stroke-dasharray="5 3"' if dashed else ""
    l0, l1 = label_at or (t0, t1)
    return (f'<rect x="{x(t0)}" y="{y - 11}" width="{x(t1) - x(t0)}" height="22" rx="4" '
            f'fill="{fill}" fill-opacity="0.18" stroke="{fill}"{style}/>'
            + text((x(l0) + x(l1)) // 2, y + 4, label, fill=fill))


def arrow(t: float, lane_from: str, lane_to: str, colour: str, label: str) -> str:
    """A write travelling from a worker's lane down (or up) to the proxy's."""
    x0, y0, y1 = x(t), LANES[lane_from] + 11, LANES[lane_to] - 12
    if y1 < y0:
        y0, y1 = LANES[lane_from] - 11, LANES[lane_to] + 12
    return (f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="{colour}" stroke-width="2" '
            f'marker-end="url(#head-{colour[1:]})"/>' + text(x0 + 6, (y0 + y1) // 2, label,
                                                             anchor="start", fill=colour, size=11))


def tick(t: float, lane: str, label: str, colour: str = INK) -> str:
    px, y = x(t), LANES[lane]
    return (f'<circle cx="{px}" cy="{y}" r="5" fill="{colour}"/>'
            + text(px, y - 12, label, fill=colour, size=11))


def render() -> str:
    """The SVG document, as text (deterministic)."""
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="Helvetica, Arial, sans-serif">',
             "<defs>"]
    for colour in (GREEN, RED):
        parts.append(f'<marker id="head-{colour[1:]}" markerWidth="6" markerHeight="6" refX="5" '
                     f'refY="3" markerUnits="userSpaceOnUse" orient="auto"><path d="M0,0 L6,3 L0,6 z" fill="{colour}"/></marker>')
    parts.append("</defs>")
    parts.append(f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>')
    parts.append(text(WIDTH // 2, 24, "A holder that froze past its lease wakes up: its write is "
                      "refused by the fence", size=15, weight="bold"))
    for lane, y in LANES.items():
        parts.append(f'<line x1="{LEFT}" y1="{y}" x2="{RIGHT}" y2="{y}" stroke="#e0e0e0"/>')
        parts.append(text(LEFT - 12, y + 4, lane, anchor="end", size=13, weight="bold"))
    # worker A: its lease (fence 5), frozen past the lease's end, woken too late
    parts.append(bar(T["a_grant"], T["a_expiry"], "worker A", BLUE, "lease, fence 5",
                     label_at=(T["a_grant"], T["a_freeze"])))
    parts.append(bar(T["a_freeze"], T["a_thaw"], "worker A", GREY, "frozen (GC pause, SIGSTOP)",
                     dashed=True, label_at=(T["a_expiry"], T["a_thaw"])))
    parts.append(arrow(T["a_write"], "worker A", "proxy + table", GREEN, "5 ok"))
    parts.append(arrow(T["a_write2"], "worker A", "proxy + table", RED, "fence 5 < highest 6: 409"))
    # lockd: grants, the expiry judged by one clock, the next grant with a higher fence
    parts.append(tick(T["a_grant"], "lockd", "grant 5"))
    parts.append(tick(T["a_expiry"], "lockd", "A expires", RED))
    parts.append(tick(T["b_grant"], "lockd", "grant 6"))
    # worker B: the new holder
    parts.append(bar(T["b_grant"], T["b_release"], "worker B", BLUE, "lease, fence 6",
                     label_at=(T["b_grant"], T["a_write2"])))
    parts.append(arrow(T["b_write"], "worker B", "proxy + table", GREEN, "6 ok"))
    # the proxy: the highest fence honoured, checked in the write's own transaction
    y = LANES["proxy + table"]
    parts.append(f'<polyline points="{x(T["a_write"])},{y + 2} {x(T["b_write"])},{y + 2} '
                 f'{x(T["b_write"])},{y - 6} {x(T["end"])},{y - 6}" fill="none" stroke="{INK}" '
                 f'stroke-width="2"/>')
    parts.append(text((x(T["a_write"]) + x(T["b_write"])) // 2, y + 20, "highest 5", size=11))
    parts.append(text((x(T["b_write"]) + x(T["end"])) // 2 + 60, y + 20, "highest 6", size=11))
    parts.append(text(x(T["a_write2"]) + 6, y + 36, "refused, nothing written", anchor="start",
                      fill=RED, size=11))
    parts.append(f'<line x1="{LEFT}" y1="{HEIGHT - 14}" x2="{RIGHT}" y2="{HEIGHT - 14}" '
                 f'stroke="{INK}" marker-end="url(#head-{GREEN[1:]})"/>')
    parts.append(text(RIGHT, HEIGHT - 20, "time", anchor="end", size=11))
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write the SVG to docs/img/timeline.svg (or the path given)."""
    out = Path(argv[0]) if argv else OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render())
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
