"""bench/goals.py: goal rows are read off the run's own sections and marked met or
not met by the right comparison (more is better for ratios, less for latency and memory)."""

from __future__ import annotations

from bench.goals import goals
from bench.report import Section


def _section(key: str, data: dict) -> Section:
    return Section(key, "t", "b", [("x", "str")], data=data)


def test_goal_rows_are_marked_from_the_runs_own_figures() -> None:
    one = _section("1", {
        "etcd lock API (baseline) @8": {"rates": [100.0, 110.0, 90.0]},
        "lockd · PostgreSQL @8": {"rates": [250.0, 150.0, 210.0]},  # median 210: 2.1×
        "lockd · PostgreSQL · --workers 2 @8": {"rates": [150.0]},  # 1.5×
        "lockd · SQLite @8": {"rates": [290.0]},  # 2.9×: not 3×
        "lockd · etcd @8": {"rates": [100.0]},
        "PostgreSQL limit: lockd's grant + release statements, psycopg @8": {"rates": [400.0]},
    })
    two = _section("2", {"lockd · SQLite": {"p99_ms": 2.5}, "lockd · PostgreSQL": {"p99_ms": 6.0}})
    four = _section("4", {"etcd lease keep-alive (baseline)": {"capacity": 4000},
                          "lockd · PostgreSQL": {"capacity": 4000},
                          "lockd · etcd": {"capacity": 1500}})
    five = _section("5", {
        "direct fenced statement, psycopg (baseline) @8": {"rows_per_s": [1000.0]},
        "through the proxy (PUT, fenced) @8": {"rows_per_s": [650.0]},
        "through the proxy, a new token every write @8": {"rows_per_s": [450.0]},
        "through the proxy, batches of 100 upserts @8": {"rows_per_s": [9000.0]},
        "fenced_transaction, psycopg (claim + UPDATE) @8": {"rows_per_s": [790.0]},
        "direct plain UPDATE, no fence, psycopg @8": {"rows_per_s": [1500.0]},
    })
    seven = _section("7", {"bytes_per_waiter": 9000.0})
    table = goals([one, two, four, five, seven])
    assert table is not None and table.key == "G"
    marks = {row[0]: (row[1], row[3]) for row in table.rows}
    assert marks["§1 lockd · PostgreSQL vs etcd's lock API, 8 clients"] == ("2.10×", "met")
    assert marks["§1 lockd · PostgreSQL · --workers 2 vs etcd's lock API, 8 clients"] == (
        "1.50×", "NOT met")
    assert marks["§1 lockd · SQLite vs etcd's lock API, 8 clients"] == ("2.90×", "NOT met")
    assert marks["§1 lockd · etcd vs etcd's lock API, 8 clients"] == ("1.00×", "met")
    assert marks["§1 lockd · PostgreSQL vs PostgreSQL's rate for its statements, 8 clients"] == (
        "0.53×", "NOT met")  # 210 of the limit row's 400 cycles/s
    assert marks["§2 handoff p99, 16 waiters, lockd · SQLite"] == ("2.50 ms", "met")
    assert marks["§2 handoff p99, 16 waiters, lockd · PostgreSQL"] == ("6.00 ms", "NOT met")
    assert marks["§4 renewal capacity, lockd · PostgreSQL vs etcd's keep-alive"][1] == "met"
    assert marks["§4 renewal capacity, lockd · etcd vs etcd's keep-alive"] == ("0.38×", "NOT met")
    assert marks["§5 through the proxy (PUT, fenced) vs direct fenced, 8 clients"] == (
        "0.65×", "met")
    assert marks["§5 through the proxy, a new token every write vs direct fenced, 8 clients"] == (
        "0.45×", "NOT met")
    assert marks["§5 fenced_transaction, psycopg (claim + UPDATE) vs direct fenced, 8 clients"] \
        == ("0.79×", "NOT met")
    assert not any("batches" in name or "plain UPDATE" in name for name in marks)
    assert marks["§7 memory per queued waiter (1,000 waiters)"] == ("9.0 KB", "NOT met")


def test_no_goal_section_when_no_goal_section_ran() -> None:
    assert goals([_section("3", {}), _section("6", {})]) is None


def test_a_failed_peer_or_limit_row_is_shown_not_dropped() -> None:
    one = _section("1", {
        "etcd lock API (baseline) @8": {"rates": [100.0]},
        "lockd · PostgreSQL @8": {"rates": [150.0]},
        "PostgreSQL limit: lockd's grant + release statements, psycopg @8": {"rates": [0.0, 0.0]},
    })
    table = goals([one])
    assert table is not None
    marks = {row[0]: (row[1], row[3]) for row in table.rows}
    assert marks["§1 lockd · PostgreSQL vs PostgreSQL's rate for its statements, 8 clients"] == (
        "– (a row failed)", "NOT measured")
    assert marks["§1 lockd · PostgreSQL vs etcd's lock API, 8 clients"] == ("1.50×", "NOT met")
