"""Goals, read off the sections of the same run: one row per goal with the measured
figure, the target and whether it is met.

Every goal is a ratio to a peer measured side by side in the same run, or a latency/memory
figure of that run, never a figure carried over from another run. A goal whose section did not
run (``BENCH_ONLY``) or whose peer is missing is left out. ``--workers`` rows are listed beside the
single-process goal rows (marked "(--workers N)") so the table shows both.
"""

from __future__ import annotations

from typing import Any

from bench.objects import CEILING
from bench.report import Section, median

__all__ = ["goals"]

_ETCD_LOCK = "etcd lock API (baseline)"
_DIRECT = "direct fenced statement, psycopg (baseline)"
_PG_LIMIT = "PostgreSQL limit: lockd's grant + release statements, psycopg"


def _rate(section: Section, name: str, clients: int) -> float | None:
    entry = section.data.get(f"{name} @{clients}")
    return median(entry["rates"]) if entry else None


def _row(goal: str, value: float | None, target: float, kind: str, more_is_better: bool = True
         ) -> list[Any] | None:
    if value is None:
        return None
    met = value >= target if more_is_better else value <= target
    unit = {"x": "×", "ms": " ms", "kb": " KB"}[kind]
    shown = f"{value:.2f}{unit}" if kind != "kb" else f"{value:.1f}{unit}"
    want = ("≥ " if more_is_better else "≤ ") + (f"{target:g}{unit}")
    return [goal, shown, want, "met" if met else "NOT met"]


def _ratio_row(goal: str, value: float | None, base: float | None, target: float
               ) -> list[Any] | None:
    """A ratio goal: left out if either row did not run (None); marked "NOT measured" if either
    ran and measured nothing (every cycle failed: its section shows the errors), so a broken
    peer or limit row cannot drop its goal from the table unseen."""
    if value is None or base is None:
        return None
    if not value or not base:
        return [goal, "– (a row failed)", f"≥ {target:g}×", "NOT measured"]
    return _row(goal, value / base, target, "x")


def goals(sections: list[Section]) -> Section | None:
    """The goals table (section key ``G``), or None if no goal's section ran."""
    by_key = {s.key: s for s in sections}
    rows: list[list[Any] | None] = []
    one = by_key.get("1")
    if one is not None:
        clients = sorted({int(k.rsplit("@", 1)[1]) for k in one.data})
        lockd_rows = [(name, target, wanted) for name, target, wanted in (
            ("lockd · PostgreSQL", 2.0, None), ("lockd · SQLite", 3.0, None),
            ("lockd · etcd", 1.0, (8, 32)))]
        for name, target, wanted in lockd_rows:
            variants = [name] + [k.rsplit(" @", 1)[0] for k in one.data
                                 if k.startswith(f"{name} · --workers")]
            for variant in dict.fromkeys(variants):
                for c in clients:
                    if wanted and c not in wanted:
                        continue
                    rows.append(_ratio_row(f"§1 {variant} vs etcd's lock API, {c} clients",
                                           _rate(one, variant, c), _rate(one, _ETCD_LOCK, c),
                                           target))
        # How much of PostgreSQL's own rate for lockd's very statements lockd delivers: what
        # lockd itself costs, whatever the peer.
        for c in clients:
            rows.append(_ratio_row(f"§1 lockd · PostgreSQL vs PostgreSQL's rate for its "
                                   f"statements, {c} clients", _rate(one, "lockd · PostgreSQL", c),
                                   _rate(one, _PG_LIMIT, c), 0.6))
    four = by_key.get("4")
    if four is not None:
        base = four.data.get("etcd lease keep-alive (baseline)", {}).get("capacity")
        for name, target in (("lockd · PostgreSQL", 1.0), ("lockd · etcd", 0.5)):
            cap = four.data.get(name, {}).get("capacity")
            rows.append(_row(f"§4 renewal capacity, {name} vs etcd's keep-alive",
                             cap / base if cap is not None and base else None, target, "x"))
    five = by_key.get("5")
    if five is not None:
        for key in five.data:
            name, _, c = key.rpartition(" @")
            base = five.data.get(f"{_DIRECT} @{c}")
            if base is None or "batches" in name:
                continue
            if name.startswith("through the proxy"):
                target = 0.5 if "new token" in name else 0.6
            elif name.startswith("fenced_transaction"):  # the SQL path's own cost of fencing
                target = 0.8
            else:
                continue
            rows.append(_ratio_row(f"§5 {name} vs direct fenced, {c} clients",
                                   median(five.data[key]["rows_per_s"]),
                                   median(base["rows_per_s"]), target))
    two = by_key.get("2")
    if two is not None:
        for name, target in (("lockd · SQLite", 3.0), ("lockd · PostgreSQL", 5.0)):
            rows.append(_row(f"§2 handoff p99, 16 waiters, {name}",
                             two.data.get(name, {}).get("p99_ms"), target, "ms", False))
    seven = by_key.get("7")
    if seven is not None and "bytes_per_waiter" in seven.data:
        rows.append(_row("§7 memory per queued waiter (1,000 waiters)",
                         seven.data["bytes_per_waiter"] / 1000, 8.0, "kb", False))
    ten = by_key.get("10")
    if ten is not None:  # fenced objects vs the same files written directly
        direct = "the same files written to a directory (baseline)"
        proxied = "fenced PUT through the proxy"
        for label, target, unit in (("4 KiB", 0.5, "PUTs/s"), ("1 MiB", 0.8, "bytes/s")):
            field = "puts_per_s" if unit == "PUTs/s" else "bytes_per_s"
            for key in ten.data:
                if not key.startswith(f"{proxied} · {label} @"):
                    continue
                c = key.rsplit("@", 1)[1]
                base = ten.data.get(f"{direct} · {label} @{c}")
                if base is None:
                    continue
                row = _ratio_row(f"§10 fenced PUT {label} vs direct file writes "
                                 f"({unit}), {c} clients", median(ten.data[key][field]),
                                 median(base[field]), target)
                ceiling = ten.data.get(f"{CEILING} · {label} @{c}")
                if row is not None and ceiling is not None and median(base[field]):
                    # the limit of this HTTP stack: a body received and dropped, nothing more
                    row[1] += (f" (HTTP ceiling "
                               f"{median(ceiling[field]) / median(base[field]):.2f}×)")
                rows.append(row)
    kept = [r for r in rows if r is not None]
    if not kept:
        return None
    section = Section("G", "Goals, from this run", "each goal's own peer or limit, "
                      "measured in this run (see its section)",
                      [("goal", "str"), ("measured", "str"), ("target", "str"), ("", "str")],
                      rows=kept)
    met = sum(r[3] == "met" for r in kept)
    section.notes.append(f"{met} of {len(kept)} goal rows met. Ratios > 1 mean more throughput "
                         "(or capacity) than the peer; KB = 1,000 bytes of lockd RSS per "
                         "queued waiter.")
    section.data = {r[0]: {"measured": r[1], "target": r[2], "met": r[3] == "met"}
                    for r in kept}
    return section
