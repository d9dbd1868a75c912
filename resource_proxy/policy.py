"""Which locks may write which tables (and rows): the ``--policy`` file.

Without a policy file every lock may write every table of the allow-list. A policy file (YAML,
or JSON, which YAML reads too) looks like::

    default: ["jobs/*"]          # patterns for tables not listed; omitted: unlisted tables are
                                 # not writable by any lock
    tables:
      accounts:
        locks: ["accounts/{key}"]    # lock accounts/7 may write row 7 and no other row
        fence_column: last_fence     # integer column set to the fence of each write
      orders:
        locks: ["orders/{customer_id}/*"]
      ledger: "ledger"               # shorthand: one pattern, or a list of patterns
      audit: {fence_column: fenced_by}   # no ``locks``: any lock

Patterns: ``*`` matches any run of characters; ``{key}`` matches the row's primary key (the
values joined by ``/`` for a composite key) and ``{column}`` one primary-key column, in their
canonical text (an integer key ``007`` is ``7``). Everything else matches itself. A pattern with
a placeholder binds a lock to a row, so locks can be sharded per row; it never matches a write
whose key is unknown (an insert that leaves its key to a database default).

The policy governs writes. A fenced read or a claim only needs a genuine token for its lock.
Errors in the file raise ``PolicyError`` at start (the server refuses to run with a bad policy).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from resource_proxy.errors import LockNotAllowed
from resource_proxy.tables import Catalog, Kind, Table, key_text

__all__ = ["Pattern", "TablePolicy", "Policy", "PolicyError", "load_policy"]

_TOKEN_RE = re.compile(r"\{([^{}]+)\}|\*")


class PolicyError(ValueError):
    """The policy file is unreadable or inconsistent with the reflected tables."""


@dataclass(frozen=True, slots=True)
class Pattern:
    """One lock-name pattern, split into literals, ``*`` and ``{placeholder}`` parts."""

    text: str
    parts: tuple[tuple[str, str], ...]  # ("lit", text) | ("any", "*") | ("var", name)

    @classmethod
    def parse(cls, text: str) -> Pattern:
        if not isinstance(text, str) or not text:
            raise PolicyError(f"lock pattern must be a non-empty string, got {text!r}")
        parts: list[tuple[str, str]] = []
        pos = 0
        for match in _TOKEN_RE.finditer(text):
            if match.start() > pos:
                parts.append(("lit", text[pos : match.start()]))
            parts.append(("var", match.group(1)) if match.group(1) else ("any", "*"))
            pos = match.end()
        if pos < len(text):
            parts.append(("lit", text[pos:]))
        if any(kind == "lit" and ("{" in value or "}" in value) for kind, value in parts):
            raise PolicyError(f"unbalanced braces in lock pattern {text!r}")
        return cls(text, tuple(parts))

    @property
    def variables(self) -> set[str]:
        return {value for kind, value in self.parts if kind == "var"}

    def matches(self, lock: str, key: Mapping[str, str] | None) -> bool:
        """Whether ``lock`` matches, placeholders bound to ``key`` (``key`` also holds ``key``)."""
        regex = []
        for kind, value in self.parts:
            if kind == "lit":
                regex.append(re.escape(value))
            elif kind == "any":
                regex.append(".*")
            else:
                if key is None or value not in key:
                    return False
                regex.append(re.escape(key[value]))
        return re.fullmatch("".join(regex), lock, flags=re.DOTALL) is not None


@dataclass(frozen=True, slots=True)
class TablePolicy:
    patterns: tuple[Pattern, ...]
    fence_column: str | None = None


_ANY = (Pattern.parse("*"),)


class Policy:
    """Lock patterns per table, plus per-table options (``fence_column``)."""

    def __init__(self, tables: Mapping[str, TablePolicy] | None = None,
                 default: Sequence[Pattern] | None = _ANY):
        self.tables = dict(tables or {})
        self.default = tuple(default or ())

    @classmethod
    def allow_all(cls) -> Policy:
        return cls()

    def patterns_for(self, table: str) -> tuple[Pattern, ...]:
        entry = self.tables.get(table)
        return entry.patterns if entry is not None else self.default

    def bind(self, catalog: Catalog) -> Catalog:
        """Check the policy against the reflected tables; return them with their fence columns.

        Raises ``PolicyError`` for a table that is not in the allow-list, a fence column that is
        missing or not an integer column, or a placeholder that names no primary-key column.
        """
        bound = dict(catalog)
        for name, entry in self.tables.items():
            table = catalog.get(name)
            if table is None:
                raise PolicyError(f"policy names table {name!r}, which the proxy does not serve")
            for pattern in entry.patterns:
                unknown = pattern.variables - {"key", *table.primary_key}
                if unknown:
                    raise PolicyError(
                        f"pattern {pattern.text!r} for table {name!r}: {sorted(unknown)} "
                        f"is neither 'key' nor a primary-key column {list(table.primary_key)}"
                    )
            if entry.fence_column is not None:
                column = table.columns.get(entry.fence_column)
                if column is None or column.kind is not Kind.INTEGER or column.generated:
                    raise PolicyError(
                        f"fence_column {entry.fence_column!r} of table {name!r} must be a "
                        "writable integer column"
                    )
                if entry.fence_column in table.primary_key:
                    raise PolicyError(f"fence_column of table {name!r} may not be in its key")
                bound[name] = table.with_fence_column(entry.fence_column)
        return bound

    def check_write(self, lock: str, table: Table, key: Sequence[Any] | None) -> None:
        """Raise ``LockNotAllowed`` unless a pattern for ``table`` matches ``lock`` for ``key``."""
        bindings: dict[str, str] | None = None
        if key is not None:
            bindings = key_text(table, key)
            bindings["key"] = "/".join(bindings[name] for name in table.primary_key)
        for pattern in self.patterns_for(table.name):
            if pattern.matches(lock, bindings):
                return
        where = f"row {bindings['key']!r} of table" if bindings else "table"
        raise LockNotAllowed(f"lock {lock!r} may not write {where} {table.name!r}", lock=lock,
                             table=table.name)


def _patterns(value: Any, where: str) -> tuple[Pattern, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise PolicyError(f"{where}: expected a pattern or a list of patterns")
    return tuple(Pattern.parse(item) for item in value)


def load_policy(path: str | Path | None) -> Policy:
    """Read a policy file (``None``: every lock may write every table)."""
    if path is None:
        return Policy.allow_all()
    try:
        text = Path(path).read_text()
        data = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise PolicyError(f"cannot read policy {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise PolicyError(f"policy {path}: expected a mapping with 'tables' and/or 'default'")
    unknown = set(data) - {"tables", "default"}
    if unknown:
        raise PolicyError(f"policy {path}: unknown keys {sorted(unknown)}")
    default = _patterns(data["default"], "default") if "default" in data else ()
    tables: dict[str, TablePolicy] = {}
    raw_tables = data.get("tables") or {}
    if not isinstance(raw_tables, dict):
        raise PolicyError(f"policy {path}: 'tables' must be a mapping")
    for name, entry in raw_tables.items():
        if isinstance(entry, str | list):
            tables[str(name)] = TablePolicy(_patterns(entry, f"tables.{name}"))
            continue
        if not isinstance(entry, dict) or set(entry) - {"locks", "fence_column"}:
            raise PolicyError(f"policy {path}: tables.{name} takes 'locks' and 'fence_column'")
        patterns = _patterns(entry["locks"], f"tables.{name}.locks") if "locks" in entry else _ANY
        fence_column = entry.get("fence_column")
        if fence_column is not None and not isinstance(fence_column, str):
            raise PolicyError(f"policy {path}: tables.{name}.fence_column must be a string")
        tables[str(name)] = TablePolicy(patterns, fence_column)
    return Policy(tables, default)
