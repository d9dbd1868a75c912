"""The model's few, overlapping names and the rows they govern.

Lock names contain one another (``acct``, ``acct/1``, ``acct/10``, ``acct/1/x``), semaphore
``enc`` (2 permits) owns the slot locks ``sem/enc/0`` and ``sem/enc/1``, and semaphore ``enc/0``
(1 permit) owns ``sem/enc/0/0``, whose name contains ``sem/enc/0``. Every name is tried as a
lock, a multi-lock member and an election; the ``sem/`` ones are reserved for permits.

Each run of the state machine works in a namespace of its own (``r7``), so runs never see each
other's leases or fences on one lockd and one database: logical ``acct/1`` is lock ``r7/acct/1``,
logical ``sem/enc/0`` is ``sem/r7/enc/0`` (the slot lock of semaphore ``r7/enc``).

Every lock governs one row of the protected database (``TABLES``, ``POLICY``), so every token
can be tried as a writer of every row.
"""

from __future__ import annotations

__all__ = ["LOCKS", "SEMAPHORES", "RESERVED", "SCHEMA", "POLICY", "TABLES", "ROWS", "Namespace"]

LOCKS = ("acct", "acct/1", "acct/10", "acct/1/x", "sem/enc/0", "sem/enc/1", "sem/enc/0/0")
SEMAPHORES = {"enc": 2, "enc/0": 1}
"""Semaphore name -> its limit (every acquire asks with it)."""
RESERVED = "sem/"

SCHEMA = """
CREATE TABLE acct_root (run text PRIMARY KEY, v bigint NOT NULL);
CREATE TABLE acct (run text, id integer, v bigint NOT NULL, PRIMARY KEY (run, id));
CREATE TABLE acct_x (run text, id integer, v bigint NOT NULL, PRIMARY KEY (run, id));
CREATE TABLE slot (run text, slot integer, v bigint NOT NULL, PRIMARY KEY (run, slot));
CREATE TABLE slot0 (run text, slot integer, v bigint NOT NULL, PRIMARY KEY (run, slot));
"""

POLICY = """
tables:
  acct_root: "{run}/acct"
  acct: "{run}/acct/{id}"
  acct_x: "{run}/acct/{id}/x"
  slot: "sem/{run}/enc/{slot}"
  slot0: "sem/{run}/enc/0/{slot}"
"""

TABLES = ("acct_root", "acct", "acct_x", "slot", "slot0")

ROWS: dict[str, tuple[str, tuple[str, ...], tuple[int, ...]]] = {
    "acct": ("acct_root", ("run",), ()),
    "acct/1": ("acct", ("run", "id"), (1,)),
    "acct/10": ("acct", ("run", "id"), (10,)),
    "acct/1/x": ("acct_x", ("run", "id"), (1,)),
    "sem/enc/0": ("slot", ("run", "slot"), (0,)),
    "sem/enc/1": ("slot", ("run", "slot"), (1,)),
    "sem/enc/0/0": ("slot0", ("run", "slot"), (0,)),
}
"""Logical lock -> (table, key columns, key values after ``run``) of the one row it governs."""


class Namespace:
    """Logical names of one run <-> the names lockd and the database see."""

    def __init__(self, run: str):
        self.run = run

    def lock(self, logical: str) -> str:
        if logical.startswith(RESERVED):
            return f"{RESERVED}{self.run}/{logical[len(RESERVED):]}"
        return f"{self.run}/{logical}"

    def semaphore(self, logical: str) -> str:
        return f"{self.run}/{logical}"

    def logical(self, physical: str) -> str | None:
        """The logical name of a lock of this run, or None for any other name."""
        if physical.startswith(f"{RESERVED}{self.run}/"):
            return RESERVED + physical[len(RESERVED) + len(self.run) + 1:]
        if physical.startswith(f"{self.run}/"):
            return physical[len(self.run) + 1:]
        return None

    def row(self, logical: str) -> tuple[str, tuple[str, ...], tuple[object, ...]]:
        table, columns, rest = ROWS[logical]
        return table, columns, (self.run, *rest)
