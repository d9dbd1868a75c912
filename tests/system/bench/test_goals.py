"""bench/goals.py: goal rows are read off the run's own sections and marked met or
not met by the right comparison (more is better for ratios, less for latency and memory)."""

from __future__ import annotations

from bench.goals import goals
from bench.objects import FLOOR
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
                          "lockd · etcd": {"capacity": 1500},
                          "lockd · PostgreSQL, renew-each": {"capacity": 2000}})
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
    marks = {row[0]: (row[1], row[4]) for row in table.rows}
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
    assert marks["§4 renewal capacity, lockd · PostgreSQL, renew-each vs etcd's keep-alive"] == (
        "0.50×", "NOT met")
    assert not any("SQLite, renew-each" in name for name in marks)  # not in this run
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
    marks = {row[0]: (row[1], row[4]) for row in table.rows}
    assert marks["§1 lockd · PostgreSQL vs PostgreSQL's rate for its statements, 8 clients"] == (
        "– (a row failed)", "NOT measured")
    assert marks["§1 lockd · PostgreSQL vs etcd's lock API, 8 clients"] == ("1.50×", "NOT met")


def test_each_goal_has_the_runs_limit_rows_beside_it_and_says_when_the_target_is_beyond() -> None:
    one = _section("1", {
        "etcd lock API (baseline) @8": {"rates": [100.0]},
        "lockd · SQLite @8": {"rates": [150.0]},
        "lockd · PostgreSQL @8": {"rates": [120.0]},
        "lockd · PostgreSQL · 2 replicas @8": {"rates": [180.0]},
        "PostgreSQL limit: lockd's grant + release statements, psycopg @8": {"rates": [400.0]},
        "do-nothing FastAPI (HTTP stack ceiling) @8": {"rates": [250.0]},  # 2.5× etcd
        "do-nothing HTTP (generator ceiling) @8": {"rates": [900.0]},
    })
    table = goals([one])
    assert table is not None
    assert [h for h, _ in table.columns] == ["goal", "measured", "target", "limit (this run)", ""]
    rows = {row[0]: row for row in table.rows}
    sqlite = rows["§1 lockd · SQLite vs etcd's lock API, 8 clients"]
    # 3× wanted, one Python process doing nothing at all reaches 2.5×: said, with the figure
    assert sqlite[1:] == ["1.50×", "≥ 3×", "one-process HTTP ceiling 2.50×: target above "
                          "one-process HTTP ceiling", "NOT met"]
    assert table.data["§1 lockd · SQLite vs etcd's lock API, 8 clients"]["beyond_limit"] is True
    assert ("§1 lockd · SQLite vs etcd's lock API, 8 clients: the target ≥ 3× is above the limit "
            "this run measured, one-process HTTP ceiling 2.50×; measured 1.50×.") in table.notes
    pg = rows["§1 lockd · PostgreSQL vs etcd's lock API, 8 clients"]
    assert pg[3] == "one-process HTTP ceiling 2.50×, PostgreSQL's rate 4.00×"
    assert not table.data[pg[0]]["beyond_limit"]
    # vs PostgreSQL's own rate, the one-process ceiling is 250 / 400 = 0.62×: above 0.6×
    share = rows["§1 lockd · PostgreSQL vs PostgreSQL's rate for its statements, 8 clients"]
    assert share[1:] == ["0.30×", "≥ 0.6×", "one-process HTTP ceiling 0.62×", "NOT met"]
    # two replicas: the generator's ceiling (several processes), and the growth over one lockd
    rep = rows["§1 lockd · PostgreSQL · 2 replicas vs etcd's lock API, 8 clients"]
    assert rep[1:] == ["1.80× (1.50× one lockd)", "≥ 2×",
                       "generator ceiling 9.00×, PostgreSQL's rate 4.00×", "NOT met"]
    rep_share = rows["§1 lockd · PostgreSQL · 2 replicas vs PostgreSQL's rate for its "
                     "statements, 8 clients"]
    assert rep_share[1:] == ["0.45× (1.50× one lockd)", "≥ 0.6×", "generator ceiling 2.25×",
                             "NOT met"]
    assert any("with replicas" in n and "8 clients 1.50×" in n for n in table.notes)


def test_proxy_and_object_goals_show_their_ceilings() -> None:
    five = _section("5", {
        "direct fenced statement, psycopg (baseline) @8": {"rows_per_s": [1000.0]},
        "through the proxy (PUT, fenced) @8": {"rows_per_s": [500.0]},
        "through the proxy, --workers 2 (PUT, fenced) @8": {"rows_per_s": [700.0]},
        "do-nothing FastAPI, one process (HTTP stack ceiling) @8": {"rows_per_s": [550.0]},
        "PostgreSQL limit: fenced statement, psycopg, 32 clients @32": {"rows_per_s": [3000.0]},
    })
    ten = _section("10", {
        "the same files written to a directory (baseline) · 4 KiB @8": {"puts_per_s": [1000.0]},
        "fenced PUT through the proxy · 4 KiB @8": {"puts_per_s": [300.0]},
        "received by a do-nothing ASGI app on the same uvicorn (the HTTP ceiling) · 4 KiB @8":
            {"puts_per_s": [400.0]},
        f"{FLOOR} · 4 KiB @8": {"puts_per_s": [450.0]},
        "the same files written to a directory (baseline) · 1 MiB @8": {"bytes_per_s": [1000.0]},
        "fenced PUT through the proxy · 1 MiB @8": {"bytes_per_s": [300.0]},
        f"{FLOOR} · 1 MiB @8": {"bytes_per_s": [900.0]},
    })
    table = goals([five, ten])
    assert table is not None
    rows = {row[0]: row for row in table.rows}
    assert rows["§5 through the proxy (PUT, fenced) vs direct fenced, 8 clients"][3] == (
        "one-process HTTP ceiling 0.55×, PostgreSQL's rate 3.00×: target above one-process "
        "HTTP ceiling")
    assert rows["§5 through the proxy, --workers 2 (PUT, fenced) vs direct fenced, 8 clients"][
        3] == "PostgreSQL's rate 3.00×"
    assert rows["§10 fenced PUT 4 KiB vs direct file writes (PUTs/s), 8 clients"][3] == (
        "design floor 0.45×, HTTP ceiling 0.40×: target above HTTP ceiling")
    # the design floor, as the same ratio; the target is beyond it when it is below 0.8×
    assert rows["§10 fenced PUT 1 MiB vs direct file writes (bytes/s), 8 clients"][3] == (
        "design floor 0.90×")


def test_a_goal_without_a_limit_row_in_the_run_says_so() -> None:
    two = _section("2", {"lockd · SQLite": {"p99_ms": 2.5}})
    one = _section("1", {"etcd lock API (baseline) @8": {"rates": [100.0]},
                         "lockd · SQLite @8": {"rates": [350.0]}})
    table = goals([one, two])
    assert table is not None
    assert all(row[3] == "–" and not table.data[row[0]]["beyond_limit"] for row in table.rows)


def test_the_cpu_a_row_spent_per_cycle_is_its_limit_beside_the_share_of_postgresqls_rate() -> None:
    """One lockd runs on one core at most: 1 core ÷ its CPU per cycle; every process shares the
    machine's cores: cores ÷ the machine's CPU per cycle. Both from the row's own window."""
    one = _section("1", {
        "etcd lock API (baseline) @8": {"rates": [100.0]},
        "lockd · PostgreSQL @8": {"rates": [200.0], "cores": 2,
                                  "cpu_ms": {"servers": 4.0, "machine": 8.0}},  # 250/s, 250/s
        "lockd · PostgreSQL · 2 replicas @8": {"rates": [180.0], "cores": 2,
                                               "cpu_ms": {"servers": 6.0, "machine": 10.0}},
        "PostgreSQL limit: lockd's grant + release statements, psycopg @8": {"rates": [500.0]},
        "do-nothing FastAPI (HTTP stack ceiling) @8": {"rates": [600.0]},
        "do-nothing HTTP (generator ceiling) @8": {"rates": [900.0]},
    })
    table = goals([one])
    assert table is not None
    rows = {row[0]: row for row in table.rows}
    share = rows["§1 lockd · PostgreSQL vs PostgreSQL's rate for its statements, 8 clients"]
    assert share[1:] == ["0.40×", "≥ 0.6×", "one-process HTTP ceiling 1.20×, lockd's one core "
                         "0.50×, the machine's 2 cores 0.50×: target above lockd's one core",
                         "NOT met"]
    # several processes: no one-core limit (two processes), the machine's cores only
    rep = rows["§1 lockd · PostgreSQL · 2 replicas vs PostgreSQL's rate for its statements, "
               "8 clients"]
    assert rep[3] == ("generator ceiling 1.80×, the machine's 2 cores 0.40×: target above "
                      "the machine's 2 cores")
    assert any("lockd's one core = 1 core ÷ the CPU lockd spent" in n for n in table.notes)
