"""``latest.png``: the run at a glance (matplotlib, no display needed).

Left: lock cycles per second by peer and client count (section 1). Right: handoff p50/p99
under contention (section 2), log scale. Below: the proxy's fenced writes against the direct
statement (section 5). Panels whose section did not run are left out.
"""

from __future__ import annotations

from pathlib import Path

from bench.report import Section

__all__ = ["draw"]


def draw(path: Path, sections: list[Section], subtitle: str) -> str | None:
    """Write the chart to ``path``; else return why not (no section with a panel ran, or
    matplotlib is not installed: ``pip install -e '.[bench]'``)."""
    try:
        import matplotlib
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]')"

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_key = {s.key: s for s in sections}
    panels = [k for k in ("1", "2", "5") if k in by_key]
    if not panels:
        return "no charted section (1, 2 or 5) ran"
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 5.2), squeeze=False)
    for ax, key in zip(axes[0], panels, strict=True):
        {"1": _cycles, "2": _handoff, "5": _proxy}[key](ax, by_key[key])
    fig.suptitle(f"lockd benchmarks — {subtitle}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def _cycles(ax, s: Section) -> None:
    rows = [r for r in s.rows if "ceiling" not in r[0]]
    peers = list(dict.fromkeys(r[0] for r in rows))
    clients = sorted({r[1] for r in rows})
    width = 0.8 / len(clients)
    for j, c in enumerate(clients):
        values = [next((r[2] or 0 for r in rows if r[0] == p and r[1] == c), 0) for p in peers]
        ax.barh([i + j * width for i in range(len(peers))], values, height=width,
                label=f"{c} client{'s' if c > 1 else ''}")
    ax.set_yticks([i + width * (len(clients) - 1) / 2 for i in range(len(peers))])
    ax.set_yticklabels([p.replace(" (baseline)", "\n(baseline)") for p in peers], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("acquire + release cycles per second (more is better)")
    ax.set_title("1. Lock cycles", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="x", alpha=0.3)


def _handoff(ax, s: Section) -> None:
    peers = [r[0] for r in s.rows]
    p50 = [r[2] or 0 for r in s.rows]
    p99 = [r[4] or 0 for r in s.rows]
    y = range(len(peers))
    ax.barh([i - 0.2 for i in y], p50, height=0.4, label="p50")
    ax.barh([i + 0.2 for i in y], p99, height=0.4, label="p99")
    ax.set_yticks(list(y))
    ax.set_yticklabels([p.replace(" (", "\n(") for p in peers], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("release → next grant, ms (log; less is better)")
    ax.set_title("2. Handoff, 16 waiters on one lock", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="x", alpha=0.3)


def _proxy(ax, s: Section) -> None:
    rows = s.rows
    labels = [f"{r[0]}\n({r[1]} clients)".replace(", psycopg", "") for r in rows]
    ax.barh(range(len(rows)), [r[2] or 0 for r in rows], color="tab:green")
    ax.set_yticks(list(range(len(rows))))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("rows written per second (more is better)")
    ax.set_title("5. Fenced writes, PostgreSQL", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
