"""One row, one lock: which lock name may write each row of each table (the ``--policy`` file).

Fencing protects a row only if everybody who writes it goes through the SAME lock: the fence
sequence is per lock name, so two names that could both write a row would be two independent
fence sequences and no exclusion at all. So the proxy computes, for every row, the ONE lock
name that may write it, and accepts a write (a fenced read, a claim) only under that name.

Without a policy file table ``T`` is governed by the single lock named exactly ``T`` (a table
whose name is not a valid lock name then needs a policy entry). A policy file (YAML, or JSON)
gives a table ONE template instead::

    tables:
      accounts: "accounts/{key}"          # row 7 is written under lock accounts/7, only
      orders:                             # every order of customer 5: lock orders/5
        lock: "orders/{customer_id}"
        fence_column: last_fence          # integer column set to the fence of each write
      ledger: "ledger"                    # a literal: one lock for the whole table
      audit_log: {unfenced: true}         # written WITHOUT a token: said at start and on /

Templates: literal lock-name characters and placeholders, ``{column}`` (one primary-key column)
or ``{key}`` (the whole primary key, its values joined by ``/``), each replaced by the value's
canonical, escaped text (``canonical``: ``1.0`` is ``1``, ``a/b`` is ``a:2Fb``). Two placeholders
must be separated by a literal ``/`` (then the name determines the values). Refused at start
(``PolicyError``; the CLI exits 2 with one line): ``*`` or any other pattern syntax, a list of
templates, the old ``locks``/``default`` keys, a placeholder that is not a key column, a key
column that has no canonical text or compares inexactly (NOCASE, citext, a nondeterministic
collation) used by a template, a table without a primary key with a placeholder template, and
a lock name that is not 1-255 characters of ``A-Za-z0-9._:/-``. A name longer than 255
characters for one row is refused for that row (422). ``unfenced: true`` is the only way to
write a table without a token; nothing is unfenced by default.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from resource_proxy.canonical import decode, key_part, unbindable
from resource_proxy.errors import InvalidRequest, LockNotAllowed
from resource_proxy.objects.names import Buckets, parse_buckets
from resource_proxy.rows.tables import Catalog, Kind, Table
from resource_proxy.rows.values import coerce

__all__ = ["Template", "TablePolicy", "Policy", "PolicyError", "TableBinding", "Binding",
           "load_policy"]

_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_LOCK_CHARS = re.compile(r"[A-Za-z0-9._:/-]*")
_LOCK_NAME = re.compile(r"[A-Za-z0-9._:/-]{1,255}")
_PART = r"[A-Za-z0-9._:-]*"  # an escaped key value: never contains "/"
MAX_LOCK = 255


class PolicyError(ValueError):
    """The policy file is unreadable, not one template per table, or does not fit the tables."""


@dataclass(frozen=True, slots=True)
class Template:
    """A lock-name template: literal text and ``{placeholder}`` parts, in order."""

    text: str
    parts: tuple[tuple[str, str], ...]  # ("lit", text) | ("var", name)

    @classmethod
    def parse(cls, text: Any, where: str) -> Template:
        if not isinstance(text, str) or not text:
            raise PolicyError(f"{where}: the lock must be one template string, got {text!r}")
        parts: list[tuple[str, str]] = []
        pos = 0
        for match in _PLACEHOLDER.finditer(text):
            if match.start() > pos:
                parts.append(("lit", text[pos:match.start()]))
            name = match.group(1)
            if not name:
                raise PolicyError(f"{where}: empty placeholder in {text!r}")
            parts.append(("var", name))
            pos = match.end()
        if pos < len(text):
            parts.append(("lit", text[pos:]))
        for kind, value in parts:
            if kind == "lit" and not _LOCK_CHARS.fullmatch(value):
                bad = sorted(set(value) - set("".join(_LOCK_CHARS.findall(value))))
                reason = ("'*' would let many lock names write one row"
                          if "*" in bad else f"{''.join(bad)!r} is not a lock-name character")
                raise PolicyError(f"{where}: template {text!r} refused: {reason}")
        variables = [i for i, (kind, _) in enumerate(parts) if kind == "var"]
        for a, b in zip(variables, variables[1:], strict=False):
            if not any(kind == "lit" and "/" in value for kind, value in parts[a + 1:b]):
                raise PolicyError(f"{where}: template {text!r}: two placeholders must be "
                                  "separated by a literal '/'")
        return cls(text, tuple(parts))

    @property
    def variables(self) -> list[str]:
        return [value for kind, value in self.parts if kind == "var"]

    @property
    def literal(self) -> bool:
        return not self.variables


@dataclass(frozen=True, slots=True)
class TablePolicy:
    """A table's policy entry: its template (None: the default, lock = table name)."""

    template: Template | None = None
    fence_column: str | None = None
    unfenced: bool = False


class Policy:
    """The parsed policy file: an entry per listed table; unlisted tables get the default."""

    def __init__(self, tables: Mapping[str, TablePolicy] | None = None,
                 buckets: Buckets | None = None):
        self.tables = dict(tables or {})
        self.buckets = buckets if buckets is not None else Buckets()

    @classmethod
    def default(cls) -> Policy:
        return cls()

    def bind(self, catalog: Catalog, *, sqlite: bool = False) -> Binding:
        """Check the policy against the reflected tables; the ``Binding`` that serves them.

        Raises ``PolicyError`` (see the module doc for every reason).
        """
        for name in self.tables:
            if name not in catalog:
                raise PolicyError(f"policy names table {name!r}, which the proxy does not serve")
        bindings: dict[str, TableBinding] = {}
        for name, table in catalog.items():
            entry = self.tables.get(name, TablePolicy())
            if entry.fence_column is not None:
                column = table.columns.get(entry.fence_column)
                if column is None or column.kind is not Kind.INTEGER or column.generated:
                    raise PolicyError(f"fence_column {entry.fence_column!r} of table {name!r} "
                                      "must be a writable integer column")
                if entry.fence_column in table.primary_key:
                    raise PolicyError(f"fence_column of table {name!r} may not be in its key")
                table = table.with_fence_column(entry.fence_column)
            template = entry.template
            if template is None and not entry.unfenced:
                if not _LOCK_NAME.fullmatch(name):
                    raise PolicyError(
                        f"table {name!r} is not a valid lock name, so it has no default lock; "
                        "give it a template in a --policy file")
                template = Template(name, (("lit", name),))
            if template is not None:
                _check_template(table, template)
            bindings[name] = TableBinding(table, template, sqlite)
        return Binding(bindings)


def _check_template(table: Table, template: Template) -> None:
    where = f"table {table.name!r}: template {template.text!r}"
    if template.literal:
        if not _LOCK_NAME.fullmatch(template.text):
            raise PolicyError(f"{where} is not a lock name (1-255 of A-Za-z0-9._:/-)")
        return
    if not table.primary_key:
        raise PolicyError(f"{where}: the table has no primary key, so rows cannot be bound "
                          "to locks (use a literal lock)")
    for name in template.variables:
        if name != "key" and name not in table.primary_key:
            raise PolicyError(f"{where}: {{{name}}} is neither {{key}} nor a primary-key "
                              f"column {list(table.primary_key)}")
        for column in (table.primary_key if name == "key" else (name,)):
            reason = unbindable(table.columns[column])
            if reason is not None:
                raise PolicyError(f"{where}: {reason}; it cannot be bound per row (use a "
                                  "literal lock for this table)")


@dataclass(slots=True)
class TableBinding:
    """How the rows of one table map to lock names. ``template`` None: the table is unfenced."""

    table: Table
    template: Template | None
    sqlite: bool = False
    _matcher: re.Pattern[str] | None = field(default=None, init=False, repr=False)

    @property
    def unfenced(self) -> bool:
        return self.template is None

    @property
    def needs_key(self) -> bool:
        return self.template is not None and not self.template.literal

    def _values(self, values: Mapping[str, Any]) -> str:
        assert self.template is not None
        out: list[str] = []
        for kind, value in self.template.parts:
            if kind == "lit":
                out.append(value)
            elif value == "key":
                out.append("/".join(self._part(c, values[c]) for c in self.table.primary_key))
            else:
                out.append(self._part(value, values[value]))
        name = "".join(out)
        if not 1 <= len(name) <= MAX_LOCK:
            raise InvalidRequest(
                f"this row of table {self.table.name!r} would be written under a lock name of "
                f"{len(name)} characters (1-{MAX_LOCK} allowed); its key cannot be bound to a lock")
        return name

    def _part(self, column: str, value: Any) -> str:
        return key_part(self.table.columns[column], value, sqlite=self.sqlite)

    def lock_for(self, key: Sequence[Any] | None) -> str | None:
        """The lock that governs the row with ``key`` (coerced values, key order); None if
        unfenced. ``InvalidRequest`` if the template needs a key and ``key`` is None."""
        if self.template is None:
            return None
        if self.template.literal:
            return self.template.text
        if key is None:
            raise InvalidRequest(
                f"rows of table {self.table.name!r} are written under lock "
                f"{self.template.text!r}: give the row's key "
                f"({', '.join(self.table.primary_key)}) so the proxy can tell which lock")
        return self._values(dict(zip(self.table.primary_key, key, strict=True)))

    def _used(self) -> list[str]:
        """The key columns the template uses, in order, each once."""
        assert self.template is not None
        used = [c for v in self.template.variables
                for c in (self.table.primary_key if v == "key" else (v,))]
        return list(dict.fromkeys(used))

    def lock_for_row(self, key: Sequence[Any] | None, values: Mapping[str, Any]) -> str | None:
        """``lock_for(key)``; for an insert whose key is left (partly) to the database, the lock
        from the row's ``values`` if they give every column the template uses
        (``orders/{customer_id}`` with a serial ``id``)."""
        if key is None and self.template is not None and not self.template.literal:
            if all(values.get(c) is not None for c in self._used()):
                return self._values(values)
        return self.lock_for(key)

    def lock_for_filters(self, filters: Mapping[str, Any]) -> str | None:
        """The one lock governing every row that matches ``filters`` (column -> value), if the
        filters pin each column the template uses; else ``InvalidRequest``."""
        if self.template is None or self.template.literal:
            return self.lock_for(None)
        missing = [c for c in self._used() if c not in filters or filters[c] is None]
        if missing:
            raise InvalidRequest(
                f"a fenced read of table {self.table.name!r} must filter on {missing}: its rows "
                f"are written under lock {self.template.text!r}, one lock per value")
        return self._values(filters)

    def require(self, lock: str, key: Sequence[Any] | None, *, verb: str = "written",
                values: Mapping[str, Any] | None = None) -> None:
        """``LockNotAllowed`` (403, ``lock`` = the lock needed) unless ``lock`` governs the row
        (its ``key``, or for an insert without one the row's ``values``)."""
        needed = self.lock_for_row(key, values or {})
        if needed is None or needed == lock:
            return
        raise self.refusal(lock, needed, key, verb)

    def refusal(self, lock: str | Sequence[str], needed: str, key: Sequence[Any] | None,
                verb: str = "written") -> LockNotAllowed:
        """The 403 for a token whose lock (``str``) or locks (a multi-lock token's names, then
        listed in ``token_locks``) do not include ``needed``."""
        if self.template is not None and self.template.literal:
            what = f"table {self.table.name!r}"
        else:
            shown = ",".join(str(v) for v in key) if key is not None else None
            what = (f"row {shown} of table {self.table.name!r}" if shown is not None
                    else f"the rows of table {self.table.name!r} that match")
        if isinstance(lock, str):
            return LockNotAllowed(f"{what} is {verb} under lock {needed!r}, not {lock!r}",
                                  lock=needed, token_lock=lock, table=self.table.name)
        held = sorted(lock)
        return LockNotAllowed(f"{what} is {verb} under lock {needed!r}, which the multi-lock "
                              f"token does not hold (it holds {held})",
                              lock=needed, token_locks=held, table=self.table.name)

    def governs(self, lock: str) -> bool:
        """Whether ``lock`` is the governing lock of some possible row of this table."""
        if self.template is None:
            return False
        if self.template.literal:
            return lock == self.template.text
        if self._matcher is None:
            regex = []
            for kind, value in self.template.parts:
                if kind == "lit":
                    regex.append(re.escape(value))
                else:
                    n = len(self.table.primary_key) if value == "key" else 1
                    regex.append("(" + "/".join([_PART] * n) + ")")
            self._matcher = re.compile("".join(regex))
        match = self._matcher.fullmatch(lock)
        if match is None:
            return False
        values: dict[str, Any] = {}
        try:
            for var, group in zip(self.template.variables, match.groups(), strict=True):
                columns = self.table.primary_key if var == "key" else (var,)
                for column, part in zip(columns, group.split("/"), strict=True):
                    value = _from_text(self.table, column, decode(part))
                    if column in values and values[column] != value:
                        return False
                    values[column] = value
            return self._values(values) == lock
        except (ValueError, InvalidRequest):
            return False


def _from_text(table: Table, column: str, text: str) -> Any:
    """A key value from its canonical text (``ValueError``/``InvalidRequest`` if it is none)."""
    col = table.columns[column]
    if col.kind is Kind.BYTES:
        text = base64.b64encode(bytes.fromhex(text)).decode("ascii")
    return coerce(col, text, from_text=True)


class Binding:
    """Every served table's ``TableBinding``: the proxy's one-row-one-lock rule."""

    def __init__(self, tables: Mapping[str, TableBinding]):
        self.tables = dict(tables)
        self.catalog: Catalog = {name: b.table for name, b in self.tables.items()}

    def __getitem__(self, table: str) -> TableBinding:
        return self.tables[table]

    @property
    def unfenced(self) -> list[str]:
        return sorted(name for name, b in self.tables.items() if b.unfenced)

    def governs(self, lock: str) -> bool:
        """Whether ``lock`` governs some row of some served table (claims need that)."""
        return any(b.governs(lock) for b in self.tables.values())

    def describe(self) -> list[dict[str, Any]]:
        """``[{table, lock, unfenced}]`` in table order (``lock``: the template, None)."""
        return [{"table": name, "lock": b.template.text if b.template else None,
                 "unfenced": b.unfenced} for name, b in sorted(self.tables.items())]


def _entry(name: str, entry: Any, where: str) -> TablePolicy:
    if isinstance(entry, str):
        return TablePolicy(Template.parse(entry, where))
    if isinstance(entry, list):
        raise PolicyError(f"{where}: a list of lock patterns is refused: give each table ONE "
                          "template, so every row has exactly one lock")
    if not isinstance(entry, dict):
        raise PolicyError(f"{where}: expected a template or a mapping")
    if "locks" in entry:
        raise PolicyError(f"{where}: 'locks' (a list of patterns) is refused: give 'lock', ONE "
                          "template, so every row has exactly one lock")
    unknown = set(entry) - {"lock", "fence_column", "unfenced"}
    if unknown:
        raise PolicyError(f"{where}: unknown keys {sorted(map(str, unknown))} "
                          "(takes lock, fence_column, unfenced)")
    unfenced = entry.get("unfenced", False)
    if not isinstance(unfenced, bool):
        raise PolicyError(f"{where}.unfenced must be true or false")
    if unfenced and "lock" in entry:
        raise PolicyError(f"{where}: an unfenced table has no lock; give 'lock' or "
                          "'unfenced: true', not both")
    template = Template.parse(entry["lock"], f"{where}.lock") if "lock" in entry else None
    fence_column = entry.get("fence_column")
    if fence_column is not None and not isinstance(fence_column, str):
        raise PolicyError(f"{where}.fence_column must be a string")
    if unfenced and fence_column is not None:
        raise PolicyError(f"{where}: an unfenced table has no fence to record")
    return TablePolicy(template, fence_column, unfenced)


def load_policy(path: str | Path | None) -> Policy:
    """Read a policy file (``None``: the default, each table under the lock named as it)."""
    if path is None:
        return Policy.default()
    try:
        text = Path(path).read_text()
        data = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        reason = " ".join(str(exc).split())
        raise PolicyError(f"cannot read policy {path}: {reason}") from exc
    if not isinstance(data, dict):
        raise PolicyError(f"policy {path}: expected a mapping with 'tables'")
    if "default" in data:
        raise PolicyError(f"policy {path}: 'default' is refused: a table not listed is written "
                          "under the lock named as the table")
    unknown = set(data) - {"tables", "buckets"}
    if unknown:
        raise PolicyError(f"policy {path}: unknown keys {sorted(map(str, unknown))}")
    raw_tables = data.get("tables") or {}
    if not isinstance(raw_tables, dict):
        raise PolicyError(f"policy {path}: 'tables' must be a mapping")
    try:  # fenced objects' buckets (``objects.names``): one lock template each
        buckets = parse_buckets(data.get("buckets"))
    except ValueError as exc:
        raise PolicyError(f"policy {path}: {exc}") from None
    return Policy({str(name): _entry(str(name), entry, f"tables.{name}")
                   for name, entry in raw_tables.items()}, buckets)


def describe_unfenced(names: Iterable[str]) -> str:
    """The start line's words for the unfenced tables ("" if none)."""
    names = list(names)
    return f"; UNFENCED (written without a token): {', '.join(names)}" if names else ""
