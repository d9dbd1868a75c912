"""The shared helpers themselves work (a throwaway cluster starts, stops and crashes)."""

import psycopg


def test_pg_database_is_fresh(pg_dsn):
    with psycopg.connect(pg_dsn) as conn:
        n = conn.execute("select count(*) from pg_tables where schemaname = 'public'").fetchone()[0]
    assert n == 0


def test_throwaway_cluster_crash_and_recover(throwaway_pg):
    with psycopg.connect(throwaway_pg.dsn, autocommit=True) as conn:
        conn.execute("create table t (x int)")
        conn.execute("insert into t values (1)")
    throwaway_pg.stop("immediate")
    throwaway_pg.start()
    with psycopg.connect(throwaway_pg.dsn) as conn:
        assert conn.execute("select x from t").fetchone()[0] == 1
