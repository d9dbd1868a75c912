"""Fault injection with a history checker: does the fence hold, Jepsen-style?

A run (``python -m chaos``, ``make chaos``) starts lockd on one store (SQLite, PostgreSQL or a
3-member etcd cluster), the fencing proxy in front of a protected database (a throwaway
PostgreSQL cluster by default, reached through a latency relay), and N worker processes that
loop under lock L: read-modify-write a counter through the proxy (claim + fenced read, think,
write counter + 1 by batch, PATCH or PUT), or write a mark blind (no claim). The database logs
every committed write itself, in commit order. A nemesis injects faults from a seeded schedule;
at the end a checker compares the database's log with the workers' own logs and reports every
violation, and the run counts the writes frozen holders sent once thawed.

Modules: ``workload`` (the worker process), ``nemesis`` (the fault schedule and its injector),
``services`` (lockd, proxy, databases as real processes), ``relay`` (the TCP relay with injected
latency), ``db`` (the protected tables and their triggers), ``checker`` (the history checker;
``transfers``: its twin for the ``transfer`` workload, two-account transfers through
multi-lock leases, whose operations are ``transferwork``),
``sqldb``/``sqlwork``/``sqlcheck`` (the ``sql`` workload: plain SQL inside
``fenced_transaction`` on a database whose own fence triggers decide, no proxy; ``rowlocks``:
the row-by-row lock rule it shares with ``transfers``),
``rwwork``/``rwcheck`` (the ``rw`` workload: readers on shared locks beside the counter's
writers, and ``sem``: semaphore permits writing their slots), ``electwork``/``electcheck`` (the
``election`` workload: leaders writing a term log),
``near`` (in every workload, operations on neighbour locks whose names contain one another and
the workload's own, judged per exact name), ``runner`` (one run, its report), ``__main__`` (the
CLI), ``mutants`` (plant a bug in a copy of the tree and check that a chaos run catches it:
``make mutants``), ``guarded``/``redisguarded`` (``--via guard``/``redis-guard``: the counter's
routes served by ``lockd.guard`` over PostgreSQL, or kept in Redis and written only through the
guard's Redis functions, the history then read back from the run's stream).

Two control modes must make the checker fail, proof that it can: ``nofence`` (the lock alone,
reads and writes straight to the database) and ``unfenced-read`` (fenced writes, reads without
the token, so no claim: the read-modify-write window of ARCHITECTURE invariant 7 stays open).
The ``sql`` workload's control, ``noclaim`` (the same SQL without ``fenced_transaction``), must
instead commit nothing: the database's triggers refuse every row.

Every write path also runs blind in some phase (no claim and no read first), so that no path's
own fence check or raise is masked by an earlier claim: blind batches and single-row POST, PUT
and DELETE (``counter``), blind multi-lock batches (``transfer``), blind SQL statements
(``sql``), blind rows of neighbour locks (``near``); and the explicit claim runs alone, followed
by plain reads without the token (``counter``).
"""

__all__: list[str] = []
