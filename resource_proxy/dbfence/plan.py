"""Which relations of the database are protected, under which template: the plan that ``install``
carries out and ``check`` compares the database with.

The policy speaks of tables the proxy serves (``policy.Policy`` + ``tables.reflect``). In the
database a table's rows may also be reached by other names; the plan covers them with the
table's own template:

- **partitions** (any depth): the row trigger on the root is cloned by PostgreSQL onto every
  partition, present and attached later, and computes the lock with the ROOT's template whatever
  name the write came through. A partition is never a policy table of its own (refused).
- **inheritance children** (any depth): governed by their nearest protected ancestor's template,
  because ``UPDATE parent`` and ``DELETE FROM parent`` reach the children's rows under the
  parent's name; install puts the ancestor's trigger function on each child (PostgreSQL does not
  inherit triggers). Listing a child as its own table, or a child with two protected ancestors,
  is refused: its rows would have two lock names. A child added later (``CREATE TABLE ...
  INHERITS``, ``ALTER TABLE ... INHERIT``) is unprotected until the next install; ``check``
  reports it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import sqlalchemy as sa

import resource_proxy.dbfence.sql as sql
from resource_proxy.dbfence.keys import key_expression, refusal
from resource_proxy.policy import Policy, PolicyError, Template
from resource_proxy.rows.tables import Column, reflect

__all__ = ["DbFencingError", "Protected", "Relation", "governed", "plan", "relations"]


class DbFencingError(ValueError):
    """The policy or the tables cannot be fenced in the database (one line saying why)."""


@dataclass(frozen=True, slots=True)
class Relation:
    """A table of the current schema as the catalog describes it."""

    name: str
    oid: int
    kind: str                 # pg_class.relkind: 'r' table, 'p' partitioned table
    partition_root: str | None  # the top partitioned table, for a partition
    parents: tuple[str, ...]  # inheritance parents (not partition parents)
    schema: str = "public"

    @property
    def qualified(self) -> str:
        return f"{sql.ident(self.schema)}.{sql.ident(self.name)}"


@dataclass(slots=True)
class Protected:
    """One protected table (a policy table) and every relation its template governs."""

    table: str
    schema: str
    template: Template
    columns: list[Column]                    # key columns the template uses, in order
    primary_key: tuple[str, ...] = ()
    partitions: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)

    @property
    def lock_function(self) -> str | None:
        return None if self.template.literal else sql.object_name("lock_of_", self.table)

    @property
    def guard_function(self) -> str:
        return sql.object_name("guard_of_", self.table)

    @property
    def row_trigger_on(self) -> list[str]:
        """Relations that get the row trigger from install (partitions get PostgreSQL's clone)."""
        return [self.table, *self.children]

    @property
    def truncate_trigger_on(self) -> list[str]:
        return [self.table, *self.partitions, *self.children]

    def lock_expression(self, refs: dict[str, str], *, inline: bool = False) -> str:
        """The row's lock name from its key columns (``refs``: column -> SQL expression), with
        the ``fencing.key_*`` calls or (``inline``) what they compute."""
        parts: list[str] = []
        for kind, value in self.template.parts:
            if kind == "lit":
                parts.append(sql.literal(value))
            else:
                names = self._key() if value == "key" else [value]
                pieces = [key_expression(self._column(n), refs[n], inline=inline)
                          for n in names]
                parts.append(" || '/' || ".join(pieces))
        return " || ".join(parts)

    def lock_sql(self) -> str:
        """``CREATE FUNCTION fencing.lock_of_<table>(key columns)`` (templated tables only)."""
        assert self.lock_function is not None
        refs = {c.name: f"${i + 1}" for i, c in enumerate(self.columns)}
        args = [(c.name, c.cast) for c in self.columns]
        return sql.lock_function(self.lock_function, args, self.lock_expression(refs))

    def guard_sql(self) -> str:
        """The row trigger function: ``lock_of_<table>``'s expression written out over NEW and
        OLD (no function call per row: ``sql.inline_key``)."""
        if self.template.literal:
            return sql.guard_function(self.guard_function, self.table, None, None,
                                      self.template.text)
        new, old = (self.lock_expression({c.name: f"{row}.{sql.ident(c.name)}"
                                          for c in self.columns}, inline=True)
                    for row in ("NEW", "OLD"))
        return sql.guard_function(self.guard_function, self.table, new, old, None)

    def _key(self) -> list[str]:
        return list(self.primary_key)

    def _column(self, name: str) -> Column:
        return next(c for c in self.columns if c.name == name)


def relations(conn: sa.Connection) -> dict[str, Relation]:
    """Ordinary and partitioned tables of the current schema, with partition roots and
    inheritance parents."""
    rows = conn.exec_driver_sql("""
        SELECT c.relname, c.oid::bigint, c.relkind::text, n.nspname,
               CASE WHEN c.relispartition THEN (SELECT r.relname FROM pg_class r
                    WHERE r.oid = pg_partition_root(c.oid)) END,
               ARRAY(SELECT p.relname FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent
                     WHERE i.inhrelid = c.oid AND NOT c.relispartition ORDER BY i.inhseqno)
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')""").all()
    return {r[0]: Relation(r[0], r[1], r[2], r[4], tuple(r[5]), r[3]) for r in rows}


def governed(rels: dict[str, Relation], names: Sequence[str]) -> set[str]:
    """``names`` and every partition and inheritance descendant of them: the relations whose
    rows are written under their templates."""
    named = set(names)
    return {n for n, r in rels.items()
            if n in named or r.partition_root in named
            or any(a in named for a in _ancestors(rels, n))} | named


def _ancestors(rels: dict[str, Relation], name: str) -> list[str]:
    out: list[str] = []
    stack = list(rels[name].parents)
    while stack:
        parent = stack.pop()
        if parent not in out and parent in rels:
            out.append(parent)
            stack.extend(rels[parent].parents)
    return out


def _refuse_keys(catalog: dict, policy: Policy, roots: list[str]) -> None:
    """``DbFencingError`` for a template placeholder whose key type the database cannot bind
    (checked before the policy's own rules, so the line names the type)."""
    for name in roots:
        entry = policy.tables.get(name)
        if entry is None or entry.template is None:
            continue
        table = catalog[name]
        for var in entry.template.variables:
            for column in (table.primary_key if var == "key" else (var,)):
                if column in table.columns and column in table.primary_key:
                    reason = refusal(table.columns[column])
                    if reason is not None:
                        raise DbFencingError(f"table {name!r}: {reason}")


def _refuse_generated(engine: sa.Engine, catalog: dict, policy: Policy, roots: list[str]) -> None:
    """``DbFencingError`` for a template placeholder on a stored generated column: a BEFORE
    trigger sees it as NULL (PostgreSQL computes it after the BEFORE triggers)."""
    with engine.connect() as conn:
        generated = {(r[0], r[1]) for r in conn.exec_driver_sql(
            "SELECT c.relname, a.attname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = current_schema()"
            " AND a.attgenerated <> '' AND c.relname = ANY(%(t)s)", {"t": roots})}
    for name in roots:
        entry = policy.tables.get(name)
        if entry is None or entry.template is None:
            continue
        pk = catalog[name].primary_key
        for var in entry.template.variables:
            for column in (pk if var == "key" else (var,)):
                if (name, column) in generated:
                    raise DbFencingError(
                        f"table {name!r}: key column {column!r} is a generated column, which "
                        "the row trigger cannot see (PostgreSQL computes it after BEFORE "
                        "triggers); use a literal lock or a stored key")


def plan(engine: sa.Engine, policy: Policy | None = None,
         tables: Sequence[str] | None = None) -> list[Protected]:
    """The protected tables of ``policy`` (default: table T under lock T) over ``tables``
    (default: every table of the current schema that is not a partition or an inheritance
    child). Raises ``DbFencingError`` (one line) for a partition or child named on its own, a
    child of two protected tables, a key type the database cannot bind, or a policy error."""
    policy = policy or Policy.default()
    if engine.dialect.name != "postgresql":
        raise DbFencingError("database-side fencing needs PostgreSQL "
                             f"(this is {engine.dialect.name})")
    with engine.connect() as conn:
        rels = relations(conn)
    named = list(dict.fromkeys([*(tables or []), *policy.tables]))
    for name in named:
        rel = rels.get(name)
        if rel is None:
            if tables is not None and name in tables:
                raise DbFencingError(f"table {name!r} not found in the current schema")
            continue
        if rel.partition_root is not None:
            raise DbFencingError(
                f"table {name!r} is a partition of {rel.partition_root!r}: its rows are governed "
                f"by the root's lock template whatever name a write uses; name "
                f"{rel.partition_root!r} in the policy instead")
    def unfenced(name: str) -> bool:
        return bool(policy.tables.get(name) and policy.tables[name].unfenced)

    if tables is None:  # children of a protected ancestor are governed by it, not roots
        candidates = [n for n, r in sorted(rels.items())
                      if r.partition_root is None and not unfenced(n)]
        roots = [n for n in candidates
                 if not any(a in candidates for a in _ancestors(rels, n))]
        roots += [n for n in policy.tables if n in rels and n not in roots and not unfenced(n)]
    else:
        roots = [n for n in dict.fromkeys(tables) if not unfenced(n)]
    for name in roots:
        above = [a for a in _ancestors(rels, name) if a in roots]
        if above:
            raise DbFencingError(
                f"table {name!r} inherits from {above[0]!r}: its rows are governed by "
                f"{above[0]!r}'s lock template (writes to {above[0]!r} reach them); do not "
                "name it as a table of its own")
    try:
        catalog = reflect(engine, roots, ())
        _refuse_keys(catalog, policy, roots)
        _refuse_generated(engine, catalog, policy, roots)
        binding = Policy({n: e for n, e in policy.tables.items() if n in roots}).bind(catalog)
    except (PolicyError, ValueError) as exc:
        raise DbFencingError(str(exc)) from exc
    out: list[Protected] = []
    for name in roots:
        tb = binding[name]
        if tb.template is None:
            continue
        pk = tb.table.primary_key
        used = dict.fromkeys(c for v in tb.template.variables for c in (pk if v == "key" else (v,)))
        columns = [tb.table.columns[c] for c in used]
        for column in columns:
            reason = refusal(column)
            if reason is not None:
                raise DbFencingError(f"table {name!r}: {reason}")
        item = Protected(name, rels[name].schema, tb.template, columns, pk)
        item.partitions = sorted(n for n, r in rels.items() if r.partition_root == name)
        item.children = sorted(n for n in rels if name in _ancestors(rels, n))
        out.append(item)
    owners: dict[str, str] = {}
    for item in out:
        for child in item.children:
            if child in owners:
                raise DbFencingError(
                    f"table {child!r} inherits from both {owners[child]!r} and {item.table!r}, "
                    "two protected tables: its rows would have two lock names")
            owners[child] = item.table
    return out
