"""How the suite runs on several pytest-xdist workers (``make test``; docs/development.md).

- **A file is one unit.** Every test runs on the worker that runs the rest of its file
  (``make_scheduler``, xdist's scope scheduling by file): a module's fixtures start once, and a
  document's examples (Sybil) run in order in one namespace.
- **Longest first.** Test files are handed out longest first, by the seconds each took in a
  recorded run (``tests/durations.json``, refreshed with ``make durations``), so the long poles
  start at once and no worker is left alone with one at the end. A file not in the record counts
  as short; tests keep their order within a file.
- **The machine's groups.** Tests that load the whole machine for a while (compose builds images
  and runs containers; chaos runs drive several servers for a fixed span and must meet their
  faults; the bench smokes measure) are scheduled in groups (``MACHINE_GROUPS``), so each group
  runs on one worker, one test at a time, never beside another of its group. The chaos runs are
  two groups of about five minutes each (the counter and transfer runs on every store; the
  other workloads and the mutants), so neither is the suite's last long pole.
- **Tiers.** ``make check`` runs the tests marked ``check`` (``CHECK_TIER``: no cluster, no
  container, no chaos run) for the inner loop; ``make test`` runs everything.

Everything else already runs beside anything: each test gets its own database (``pg_dsn``), its
own temporary directory, its own lock names, and ports from its worker's own block
(``harness.processes.free_port``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DURATIONS = ROOT / "tests" / "durations.json"

MACHINE_GROUPS: dict[str, str] = {
    "tests/system/demo/test_compose_real.py": "containers",
    "tests/system/demo/test_compose.py": "containers",
    "tests/system/chaos/test_runs.py": "chaos-stores",
    "tests/system/chaos/test_sql.py": "chaos-stores",
    "tests/system/chaos/test_mode_runs.py": "chaos-kinds",
    "tests/system/chaos/test_guard_runs.py": "chaos-kinds",
    "tests/system/chaos/test_objects.py": "chaos-kinds",
    "tests/system/chaos/test_mutants.py": "chaos-kinds",
    "tests/system/bench/": "bench",
}
"""Path (a file, or a folder ending in ``/``) → its group on the machine."""

CHECK_TIER: tuple[str, ...] = (
    "README.md", "docs/",
    "tests/common/", "tests/test_layout.py", "tests/test_support.py", "tests/test_zygote.py",
    "tests/client/test_core.py", "tests/client/test_known_loss.py",
    "tests/client/test_public_api.py", "tests/client/test_sqlfence_hints.py",
    "tests/client/test_sqlfence_keys.py",
    "tests/guard/test_guard.py", "tests/guard/test_stores.py",
    "tests/proxy/dbfence/test_read_claims.py", "tests/proxy/objects/test_blobs.py",
    "tests/proxy/test_contract.py", "tests/proxy/test_hostile_values.py",
    "tests/proxy/test_hot_path.py", "tests/proxy/test_jwks.py", "tests/proxy/test_policy.py",
    "tests/proxy/test_sqlite_numerics.py", "tests/proxy/test_with_lockd.py",
    "tests/server/store/sqlite/", "tests/server/test_clock.py", "tests/server/test_deadlines.py",
    "tests/server/test_durations.py", "tests/server/test_lease_ids.py",
    "tests/server/test_multi_tokens.py",
    "tests/system/chaos/test_checker.py", "tests/system/chaos/test_election_checker.py",
    "tests/system/chaos/test_near.py", "tests/system/chaos/test_progress.py",
    "tests/system/chaos/test_rw_checker.py",
    "tests/system/hostile/test_event_inputs.py", "tests/system/hostile/test_proxy_bounds.py",
    "tests/system/readme/test_paste.py",
)
"""``make check``'s tier (marked ``check``): unit and contract tests that start no etcd
cluster, no container and no chaos run; a path ending in ``/`` takes its folder."""


def relative(item: pytest.Item) -> str:
    try:
        return Path(str(item.path)).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return str(item.path)


def _under(path: str, prefix: str) -> bool:
    return path == prefix or (prefix.endswith("/") and path.startswith(prefix))


def group_of(path: str) -> str | None:
    for prefix, group in MACHINE_GROUPS.items():
        if _under(path, prefix):
            return group
    return None


def recorded() -> dict[str, float]:
    try:
        return json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}


def mark(item: pytest.Item) -> None:
    """The ``check`` mark for an item of the check tier."""
    if any(_under(relative(item), prefix) for prefix in CHECK_TIER):
        item.add_marker(pytest.mark.check)


def unit_of(nodeid: str) -> str:
    """The unit a test is scheduled in: its machine group, else its file."""
    path = nodeid.split("::", 1)[0]
    return group_of(path) or path


def make_scheduler(config: pytest.Config, log):
    """xdist's scope scheduling with ``unit_of`` as the scope: a file (or a machine group) goes
    to one worker whole, in collection order (``arrange``: longest first)."""
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return UnitScheduling(config, log)


def arrange(items: list[pytest.Item]) -> None:
    """Order ``items`` longest file (or machine group) first, keeping each file's order."""
    seconds: dict[str, float] = {}
    for path, spent in recorded().items():
        key = group_of(path) or path
        seconds[key] = seconds.get(key, 0.0) + spent
    unit = {id(item): group_of(relative(item)) or relative(item) for item in items}
    position = {id(item): n for n, item in enumerate(items)}
    items.sort(key=lambda item: (-seconds.get(unit[id(item)], 0.0), position[id(item)]))
