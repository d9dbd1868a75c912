"""The embedded SQLite store: ``sqlite:///path.db`` (one lockd process, one file).

``store`` (``SqliteStore``: the file, its one thread and group commit), ``locks`` (single and
multi-lock leases; ``modes``: shared holders), ``semaphores``, ``elections``. The design:
docs/stores/sqlite.md.
"""

from lockd.server.store.sqlite.store import SqliteStore

__all__ = ["SqliteStore"]
