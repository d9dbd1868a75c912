"""Goals, read off the sections of the same run: one row per goal with the measured figure, the
target, the limit rows of that run beside it, and whether it is met.

Every goal is a ratio to a peer measured side by side in the same run, or a latency/memory
figure of that run, never a figure carried over from another run. A goal whose section did not
run (``BENCH_ONLY``) or whose peer is missing is left out. ``--workers`` and replicas rows are
listed beside the single-process goal rows so the table shows both.

The limit column: each goal's ceilings measured in the same run, as the same ratio as the goal
(to the same peer). For one lockd or one proxy process, the ceiling of its HTTP stack (one
Python process answering the same requests with no work behind them) and PostgreSQL's own rate
for the same statements; for several processes (``--workers``, replicas), the generator's own
ceiling and PostgreSQL's. Where the target is above the lowest of them the cell says so, and the
section's notes give the measurement: no code in that process can reach the goal on this machine.

Item 3's rows (lockd vs PostgreSQL's own rate) also show what the CPU measured in the row itself
allows (``_cpu_limits``): one core ÷ lockd's CPU per cycle, and the machine's cores ÷ the whole
machine's CPU per cycle. Those bound this code as measured, not any code.
"""

from __future__ import annotations

from typing import Any

from bench.objects import CEILING, FLOOR
from bench.proxy_bench import FLOOR as SQL_FLOOR
from bench.report import Section, median

__all__ = ["goals", "COLUMNS"]

_ETCD_LOCK = "etcd lock API (baseline)"
_DIRECT = "direct fenced statement, psycopg (baseline)"
_PG_LIMIT = "PostgreSQL limit: lockd's grant + release statements, psycopg"
_HTTP_CEILING = "do-nothing FastAPI (HTTP stack ceiling)"
_GEN_CEILING = "do-nothing HTTP (generator ceiling)"
_PROXY_CEILING = "do-nothing FastAPI, one process (HTTP stack ceiling)"
_PG5_LIMIT = "PostgreSQL limit: fenced statement, psycopg"
_MULTI = ("--workers", "replicas")  # rows of several server processes
# The table's columns; ``mark`` (last) is "met", "NOT met" or "NOT measured".
COLUMNS = [("goal", "str"), ("measured", "str"), ("target", "str"),
           ("limit (this run)", "str"), ("", "str")]
_LIMIT, _MARK = 3, 4
_ABOVE = ": target above "  # in a limit cell: the target is above the limit named after it

Limits = list[tuple[str, float | None]]  # (what, its raw figure, in the goal's base's unit)


def _rate(section: Section, name: str, clients: int | str) -> float | None:
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
    return [goal, shown, want, "–", "met" if met else "NOT met"]


def _ratio_row(goal: str, value: float | None, base: float | None, target: float,
               limits: Limits = ()) -> list[Any] | None:
    """A ratio goal: left out if either row did not run (None); marked "NOT measured" if either
    ran and measured nothing (every cycle failed: its section shows the errors), so a broken
    peer or limit row cannot drop its goal from the table unseen. ``limits``: the run's ceilings
    for this goal, each as a raw figure divided by ``base`` like ``value``."""
    if value is None or base is None:
        return None
    if not value or not base:
        return [goal, "– (a row failed)", f"≥ {target:g}×", "–", "NOT measured"]
    row = _row(goal, value / base, target, "x")
    assert row is not None
    shown = [(what, raw / base) for what, raw in limits if raw is not None]
    if shown:
        row[_LIMIT] = ", ".join(f"{what} {r:.2f}×" if r else f"{what} – (row failed)"
                                for what, r in shown)
        measured = [(what, r) for what, r in shown if r]
        if measured:
            what, lowest = min(measured, key=lambda x: x[1])
            if lowest < target:  # not even the ceiling reaches the target here
                row[_LIMIT] += f"{_ABOVE}{what}"
    return row


def _cpu_limits(section: Section, variant: str, clients: int, multi: bool) -> Limits:
    """The cycles/s the CPU spent per cycle in ``variant``'s own rows allows: one process
    (``multi`` False) runs on one core at most, so 1 core ÷ its CPU per cycle; every process
    shares the machine's cores, so cores ÷ the machine's CPU per cycle (servers, store and
    generator together). [] when the run did not measure CPU."""
    entry = section.data.get(f"{variant} @{clients}") or {}
    cpu_ms, cores = entry.get("cpu_ms") or {}, entry.get("cores")
    limits: Limits = []
    if not multi and cpu_ms.get("servers"):
        limits.append(("lockd's one core", 1000 / cpu_ms["servers"]))
    if cores and cpu_ms.get("machine"):
        limits.append((f"the machine's {cores} cores", cores * 1000 / cpu_ms["machine"]))
    return limits


def _lock_cycle_rows(one: Section) -> tuple[list[list[Any] | None], list[str]]:
    """Section 1's goals: each lockd variant vs etcd's lock API and, on PostgreSQL, vs
    PostgreSQL's own rate for lockd's statements; plus how the replicas rows grow."""
    rows: list[list[Any] | None] = []
    growth: list[str] = []
    clients = sorted({int(k.rsplit("@", 1)[1]) for k in one.data})
    for name, target, wanted in (("lockd · PostgreSQL", 2.0, None), ("lockd · SQLite", 3.0, None),
                                 ("lockd · etcd", 1.0, (8, 32))):
        variants = [name] + [k.rsplit(" @", 1)[0] for k in one.data
                             if k.startswith(f"{name} · ") and any(m in k for m in _MULTI)]
        for variant in dict.fromkeys(variants):
            multi = any(m in variant for m in _MULTI)
            for c in clients:
                if wanted and c not in wanted:
                    continue
                limits: Limits = [("generator ceiling", _rate(one, _GEN_CEILING, c)) if multi
                                  else ("one-process HTTP ceiling", _rate(one, _HTTP_CEILING, c))]
                if name == "lockd · PostgreSQL":
                    limits.append(("PostgreSQL's rate", _rate(one, _PG_LIMIT, c)))
                value = _rate(one, variant, c)
                rows.append(_ratio_row(f"§1 {variant} vs etcd's lock API, {c} clients", value,
                                       _rate(one, _ETCD_LOCK, c), target, limits))
                if name != "lockd · PostgreSQL":
                    continue
                # How much of PostgreSQL's own rate for lockd's very statements lockd delivers:
                # what lockd itself costs, whatever the peer.
                rows.append(_ratio_row(f"§1 {variant} vs PostgreSQL's rate for its statements, "
                                       f"{c} clients", value, _rate(one, _PG_LIMIT, c), 0.6,
                                       [limits[0], *_cpu_limits(one, variant, c, multi)]))
                single = _rate(one, name, c)
                if "replicas" in variant and value and single:
                    growth.append(f"{c} clients {value / single:.2f}×")
                    for row in rows[-2:]:
                        if row is not None and row[_MARK] != "NOT measured":
                            row[1] += f" ({value / single:.2f}× one lockd)"
    notes = []
    if growth:
        notes.append("§1 lockd · PostgreSQL with replicas, cycles/s over one lockd's in the same "
                     "run: " + "; ".join(growth) + ".")
    return rows, notes


def _proxy_rows(five: Section) -> list[list[Any] | None]:
    rows: list[list[Any] | None] = []
    pg_limit = next((median(v["rows_per_s"]) for k, v in five.data.items()
                     if k.startswith(_PG5_LIMIT)), None)
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
        limits: Limits = []
        ceiling = five.data.get(f"{_PROXY_CEILING} @{c}")
        if name.startswith("through the proxy") and "--workers" not in name and ceiling:
            limits.append(("one-process HTTP ceiling", median(ceiling["rows_per_s"])))
        limits.append(("PostgreSQL's rate", pg_limit))
        if name.startswith("fenced_transaction"):
            floor = five.data.get(f"{SQL_FLOOR} @{c}")
            limits.append(("two-round-trip floor", median(floor["rows_per_s"]) if floor else None))
        rows.append(_ratio_row(f"§5 {name} vs direct fenced, {c} clients",
                               median(five.data[key]["rows_per_s"]),
                               median(base["rows_per_s"]), target, limits))
    return rows


def _object_rows(ten: Section) -> list[list[Any] | None]:
    """Fenced objects vs the same files written directly, beside the design floor (receive,
    the baseline's write, one durable pointer upsert: the least any design where the database
    decides pays) and the HTTP stack's ceiling (a body received and dropped, nothing more)."""
    rows: list[list[Any] | None] = []
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
            limits: Limits = []
            for what, name in (("design floor", FLOOR), ("HTTP ceiling", CEILING)):
                if (row := ten.data.get(f"{name} · {label} @{c}")) is not None:
                    limits.append((what, median(row[field])))
            rows.append(_ratio_row(f"§10 fenced PUT {label} vs direct file writes ({unit}), "
                                   f"{c} clients", median(ten.data[key][field]),
                                   median(base[field]), target, limits))
    return rows


def goals(sections: list[Section]) -> Section | None:
    """The goals table (section key ``G``), or None if no goal's section ran."""
    by_key = {s.key: s for s in sections}
    rows: list[list[Any] | None] = []
    notes: list[str] = []
    if (one := by_key.get("1")) is not None:
        more, notes = _lock_cycle_rows(one)
        rows += more
    if (four := by_key.get("4")) is not None:
        base = four.data.get("etcd lease keep-alive (baseline)", {}).get("capacity")
        # the renew-each rows are what the client's background renewal sends
        for name, target in (("lockd · PostgreSQL", 1.0), ("lockd · etcd", 0.5),
                             ("lockd · PostgreSQL, renew-each", 1.0),
                             ("lockd · SQLite, renew-each", 1.0)):
            if name.endswith("renew-each") and name not in four.data:
                continue  # a run that left the batched rows out
            cap = four.data.get(name, {}).get("capacity")
            rows.append(_row(f"§4 renewal capacity, {name} vs etcd's keep-alive",
                             cap / base if cap is not None and base else None, target, "x"))
    if (five := by_key.get("5")) is not None:
        rows += _proxy_rows(five)
    if (two := by_key.get("2")) is not None:
        for name, target in (("lockd · SQLite", 3.0), ("lockd · PostgreSQL", 5.0)):
            rows.append(_row(f"§2 handoff p99, 16 waiters, {name}",
                             two.data.get(name, {}).get("p99_ms"), target, "ms", False))
    seven = by_key.get("7")
    if seven is not None and "bytes_per_waiter" in seven.data:
        rows.append(_row("§7 memory per queued waiter (1,000 waiters)",
                         seven.data["bytes_per_waiter"] / 1000, 8.0, "kb", False))
    if (ten := by_key.get("10")) is not None:
        rows += _object_rows(ten)
    kept = [r for r in rows if r is not None]
    if not kept:
        return None
    section = Section("G", "Goals, from this run", "each goal's own peer or limit, "
                      "measured in this run (see its section)", list(COLUMNS), rows=kept)
    met = sum(r[_MARK] == "met" for r in kept)
    beyond = [r for r in kept if _ABOVE in r[_LIMIT]]
    section.notes.append(f"{met} of {len(kept)} goal rows met; {len(beyond)} have a target "
                         "beyond a limit measured in this run. Ratios > 1 mean more throughput "
                         "(or capacity) than the peer; KB = 1,000 bytes of lockd RSS per "
                         "queued waiter.")
    section.notes.append(
        "Limit column, as the same ratio as the goal: one-process HTTP ceiling = one Python "
        "process on lockd's (or the proxy's) HTTP stack answering the same requests with no "
        "work behind them, on this 2-core machine it shares with the load generator and the "
        "store; PostgreSQL's rate = the same statements sent straight to PostgreSQL; generator "
        "ceiling = the load generator against a do-nothing server (for rows of several server "
        "processes); design floor (§10) = a minimal app that only receives the body, writes it "
        "as the baseline does and commits one durable pointer upsert in PostgreSQL; lockd's "
        "one core = 1 core ÷ the CPU lockd spent per cycle in that very row (what one event "
        "loop of this code allows at 100 % busy); the machine's N cores = N ÷ the CPU every "
        "core spent per cycle in that row, lockd, PostgreSQL and generator together (what these "
        "processes allow at their measured costs with every core busy). The last two are "
        "limits of the code as measured, not of any code: above them, a target is reached only "
        "by spending less CPU per cycle.")
    for r in beyond:
        cell, what = r[_LIMIT].split(_ABOVE)
        value = cell.split(f"{what} ", 1)[1].split(",")[0]
        notes.append(f"{r[0]}: the target {r[2]} is above the limit this run measured, "
                     f"{what} {value}; measured {r[1]}.")
    section.notes += notes
    section.data = {r[0]: {"measured": r[1], "target": r[2], "limit": r[_LIMIT],
                           "beyond_limit": _ABOVE in r[_LIMIT],
                           "met": r[_MARK] == "met"} for r in kept}
    return section
