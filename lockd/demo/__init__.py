"""The revived-holder demo: ``make demo`` / ``python -m lockd.demo``.

Three scenes with real worker processes show what each part of the design is for: renewal keeps
a lease alive through long work (scene 1), the TTL frees the lock of a crashed holder (scene 2),
and the fencing token stops a holder that froze past its lease and woke up believing it still
holds the lock (scene 3). Modules: ``__main__`` (command line, set-up and clean-up), ``scenes``
(the three scenes and their checks), ``worker`` (one worker process), ``timeline`` (events and
their printing), ``services`` (starting lockd and the proxy), ``table`` (the demo table),
``procs`` (child processes that cannot outlive the demo).
"""

__all__: list[str] = []
