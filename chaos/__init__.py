"""Fault injection with a history checker: does the fence hold, Jepsen-style?

A run (``python -m chaos``, ``make chaos``) starts lockd on one store (SQLite, PostgreSQL or a
3-member etcd cluster), the fencing proxy in front of a protected database (a throwaway
PostgreSQL cluster by default), and N worker processes that loop: acquire lock L, read a counter
through the proxy with the lease's token (a fenced read), think, then write counter + 1 and a
history row in one batch. A nemesis injects faults from a seeded schedule; at the end a checker
compares the final database with the workers' own logs and reports every violation.

Modules: ``workload`` (the worker process), ``nemesis`` (the fault schedule and its injector),
``services`` (lockd, proxy, databases as real processes), ``db`` (the protected tables),
``checker`` (the history checker), ``runner`` (one run, its report), ``__main__`` (the CLI).

Two control modes must make the checker fail, proof that it can: ``nofence`` (the lock alone,
reads and writes straight to the database) and ``unfenced-read`` (fenced writes, reads without
the token, so no claim: the read-modify-write window of ARCHITECTURE invariant 7 stays open).
"""

__all__: list[str] = []
