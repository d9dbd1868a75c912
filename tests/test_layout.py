"""The package walls: who may import whom, read from the source with ``ast``.

::

    lockd/client      talks HTTP only: nothing from lockd.server or resource_proxy
    resource_proxy    from lockd only lockd.tokens and lockd.common
    lockd/server/store  no web framework, nothing of lockd.server but its errors
    services, core    no web framework (every slice's service.py, the core's non-HTTP modules)
    lockd/tokens.py, lockd/common  nothing of either service (nor of the client)
    slices            lockd/server/{locks,semaphores,elections} import the core, the store
                      protocols and values, and shared infrastructure: never another slice
    core              lockd/server/core imports no slice
    store backends    each backend's locks/semaphores/elections.py import their own backend's
                      modules (not its store.py, nor another primitive's file), the store's
                      values and lockd's errors: nothing else of lockd
    same files        every backend has store/locks/semaphores/elections.py; every slice its
                      service/api/schemas.py (semaphores and elections: observe.py too)
    sizes             no module of lockd/ or resource_proxy/ over 600 lines

Every import counts: at module level, inside functions, under ``TYPE_CHECKING``. The rules are
checked on the real tree, and each is shown to bite by breaking it in a copy.
"""

from __future__ import annotations

import ast
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

WEB = ("fastapi", "starlette", "uvicorn")
HTTP_LAYER = ("lockd.common.middleware", "lockd.common.responses", "lockd.common.serving")


def _imports(root: Path, path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in one file."""
    tree = ast.parse(path.read_text(), str(path))
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            yield node.lineno, module
            for alias in node.names:  # ``from lockd import server`` names a module too
                yield node.lineno, f"{module}.{alias.name}"


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _files(root: Path, rel: str) -> list[Path]:
    target = root / rel
    return [target] if target.is_file() else sorted(target.rglob("*.py"))


# (name, files, forbidden prefixes, allowed exceptions)
WALLS = [
    ("1 client talks HTTP only", "lockd/client", ("lockd.server", "resource_proxy"), ()),
    ("2 proxy uses only tokens + common", "resource_proxy", ("lockd",),
     ("lockd.tokens", "lockd.common")),
    ("3 stores know no web or HTTP layer", "lockd/server/store",
     (*WEB, *HTTP_LAYER, "lockd.server"), ("lockd.server.errors", "lockd.server.store")),
    *[("4 services know no web framework", f"lockd/server/{part}.py", WEB, ())
      for part in ("locks/service", "semaphores/service", "elections/service", "core/base",
                   "core/signer", "core/names", "core/waiting")],
    ("5 tokens import no service", "lockd/tokens.py",
     ("lockd.server", "lockd.client", "resource_proxy"), ()),
    ("5 common imports no service", "lockd/common",
     ("lockd.server", "lockd.client", "resource_proxy"), ()),
    *[("6 the harness, bench and chaos import nothing from tests", top, ("tests",), ())
      for top in ("harness", "bench", "chaos")],
]


def violations(root: Path) -> list[str]:
    """Every import across a wall in the tree at ``root``, as ``wall: file:line imports module``."""
    found = []
    for name, rel, forbidden, allowed in WALLS:
        for path in _files(root, rel):
            for line, module in _imports(root, path):
                if _under(module, forbidden) and not _under(module, allowed):
                    found.append(f"{name}: {path.relative_to(root)}:{line} imports {module}")
    return found


def test_the_tree_has_the_layout():
    for rel in ["lockd/server/app.py", "lockd/server/store/base.py", "lockd/server/cli.py",
                "lockd/client/sync.py", "lockd/client/aio.py", "lockd/client/lockctl.py",
                "lockd/common/middleware.py", "lockd/common/problems.py", "lockd/tokens.py",
                "lockd/demo/__main__.py"]:
        assert (ROOT / rel).is_file(), rel
    flat = sorted(p.name for p in (ROOT / "lockd").glob("*.py"))
    assert flat == ["__init__.py", "tokens.py"], flat


def test_every_wall_holds():
    assert violations(ROOT) == []


PLANTED = [
    ("lockd/client/fenced.py", "from lockd.server.errors import LeaseLost\n", "1 client"),
    ("lockd/client/lease.py", "import resource_proxy.rows.tables\n", "1 client"),
    ("resource_proxy/rows/service.py", "from lockd.server import service\n", "2 proxy"),
    ("resource_proxy/api.py", "from lockd.client import LockClient\n", "2 proxy"),
    ("resource_proxy/jwks.py", "from lockd import server\n", "2 proxy"),
    ("lockd/server/store/sqlite/store.py", "from starlette.responses import Response\n", "3 stores"),
    ("lockd/server/store/base.py", "from lockd.common.middleware import ROLE\n", "3 stores"),
    ("lockd/server/store/etcd/store.py", "    from ...locks.api import create_router\n", "3 stores"),
    ("lockd/server/store/sqlite/locks.py", "from lockd.server.core.waiting import PERMIT\n",
     "3 stores"),
    ("lockd/server/locks/service.py", "from fastapi import Request\n", "4 services"),
    ("lockd/server/core/signer.py", "from starlette.requests import Request\n", "4 services"),
    ("lockd/tokens.py", "from lockd.client.errors import InvalidToken\n", "5 tokens"),
    ("lockd/common/middleware.py", "from resource_proxy.errors import ProxyError\n", "5 common"),
    ("bench/compare.py", "from tests.server.conftest import LockdServer\n", "6 the harness"),
    ("chaos/services.py", "    from tests import parallel\n", "6 the harness"),
    ("harness/servers.py", "import tests.support\n", "6 the harness"),
]


@pytest.mark.parametrize(("rel", "line", "wall"), PLANTED, ids=[p[0] for p in PLANTED])
def test_a_planted_forbidden_import_breaks_its_wall(tmp_path, rel, line, wall):
    for top in ("lockd", "resource_proxy", "harness", "bench", "chaos"):
        shutil.copytree(ROOT / top, tmp_path / top,
                        ignore=shutil.ignore_patterns("__pycache__", "results"))
    target = tmp_path / rel
    if line.startswith("    "):  # inside a function, where lazy imports hide
        line = "def _lazy():\n" + line
    target.write_text(target.read_text() + "\n" + line)
    found = violations(tmp_path)
    assert found and all(v.startswith(wall) for v in found), found


# --- slices over one core ----------------------------------------------------------------------
# Each primitive is a slice of its own (service, routes, schemas; semaphores and elections also
# their ``observe`` mixin) over one core. A slice may use the core, the store's protocols and
# values and the shared infrastructure below; a new primitive is one new slice that cannot
# depend on another one (elections stand on the core's queues and signer, not on the locks'
# service). The core imports no slice.

SLICES = ("locks", "semaphores", "elections")
SHARED = ("lockd.server.core", "lockd.server.store.base", "lockd.server.store.values",
          "lockd.server.errors", "lockd.server.settings", "lockd.server.access",
          "lockd.server.limits", "lockd.server.metrics", "lockd.server.audit",
          "lockd.server.events", "lockd.server.streams")
"""What a slice (and the core) may import from ``lockd.server``, besides its own folder."""
BACKENDS = ("sqlite", "postgres", "etcd")
PRIMITIVE_FILES = ("locks", "semaphores", "elections")
SLICE_FILES = {"locks": ("service", "api", "schemas"),
               "semaphores": ("service", "api", "schemas", "observe"),
               "elections": ("service", "api", "schemas", "observe")}
MAX_LINES = 600


def slice_violations(root: Path) -> list[str]:
    """Every import of ``lockd.server`` by a slice or the core outside what it may use."""
    found = []
    for part in ("core", *SLICES):
        allowed = (f"lockd.server.{part}", *SHARED)
        for path in _files(root, f"lockd/server/{part}"):
            for line, module in _imports(root, path):
                if (_under(module, ("lockd.server",)) and module != "lockd.server"
                        and not _under(module, allowed)):
                    found.append(f"{part}: {path.relative_to(root)}:{line} imports {module}")
    return found


def backend_violations(root: Path) -> list[str]:
    """Every import of lockd by a backend's primitive file outside its own backend's modules
    (its ``store.py`` and the other primitives' files excluded), the values and the errors."""
    found = []
    for backend in BACKENDS:
        package = f"lockd.server.store.{backend}"
        for name in PRIMITIVE_FILES:
            path = root / f"lockd/server/store/{backend}/{name}.py"
            others = tuple(f"{package}.{n}" for n in ("store", *PRIMITIVE_FILES) if n != name)
            for line, module in _imports(root, path):
                if not _under(module, ("lockd",)):
                    continue
                own = _under(module, (package,)) and module != package
                if (own and not _under(module, others)) or _under(
                        module, ("lockd.server.store.values", "lockd.server.errors")):
                    continue
                found.append(f"{backend}/{name}.py:{line} imports {module}")
    return found


def layout_gaps(root: Path) -> list[str]:
    """The files a backend or a slice lacks."""
    wanted = [f"lockd/server/store/{b}/{n}.py" for b in BACKENDS for n in ("store", *PRIMITIVE_FILES)]
    wanted += [f"lockd/server/{s}/{n}.py" for s, names in SLICE_FILES.items() for n in names]
    return [rel for rel in wanted if not (root / rel).is_file()]


def oversized(root: Path) -> list[str]:
    """Every module of lockd/ and resource_proxy/ over ``MAX_LINES`` lines."""
    found = []
    for top in ("lockd", "resource_proxy"):
        for path in sorted((root / top).rglob("*.py")):
            lines = len(path.read_text().splitlines())
            if lines > MAX_LINES:
                found.append(f"{path.relative_to(root)}: {lines} lines")
    return found


def test_slices_stand_on_the_core_not_on_each_other():
    assert slice_violations(ROOT) == []


def test_backend_primitive_files_use_only_their_own_backend():
    assert backend_violations(ROOT) == []


def test_every_backend_and_every_slice_has_the_same_files():
    assert layout_gaps(ROOT) == []


def test_no_module_is_over_the_size_limit():
    assert oversized(ROOT) == []


def _copy(tmp_path: Path) -> Path:
    for top in ("lockd", "resource_proxy"):
        shutil.copytree(ROOT / top, tmp_path / top, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


@pytest.mark.parametrize(("rel", "line", "rule"), [
    ("lockd/server/elections/service.py", "from lockd.server.locks.service import LockService\n",
     "elections"),
    ("lockd/server/semaphores/api.py", "    from lockd.server.elections import schemas\n",
     "semaphores"),
    ("lockd/server/locks/api.py", "from lockd.server.observe import ObservedStore\n", "locks"),
    ("lockd/server/locks/service.py", "from lockd.server.store.sqlite import SqliteStore\n",
     "locks"),
    ("lockd/server/core/base.py", "from lockd.server.semaphores.service import slot_lock\n",
     "core"),
    ("lockd/server/core/http.py", "from ..ops_api import OPEN_PATHS\n", "core"),
])
def test_a_slice_importing_another_slice_is_found(tmp_path, rel, line, rule):
    root = _copy(tmp_path)
    target = root / rel
    if line.startswith("    "):
        line = "def _lazy():\n" + line
    target.write_text(target.read_text() + "\n" + line)
    found = slice_violations(root)
    assert found and all(v.startswith(rule + ":") for v in found), found


@pytest.mark.parametrize(("rel", "line"), [
    ("lockd/server/store/sqlite/semaphores.py", "from lockd.server.store.sqlite.locks import SCHEMA\n"),
    ("lockd/server/store/sqlite/locks.py", "    from lockd.server.store.sqlite.store import log\n"),
    ("lockd/server/store/postgres/elections.py", "from lockd.server.store.etcd import wire\n"),
    ("lockd/server/store/etcd/locks.py", "from lockd.server.store.base import LockStore\n"),
    ("lockd/server/store/etcd/semaphores.py", "from lockd.server.store import etcd\n"),
])
def test_a_backend_primitive_file_importing_beyond_its_backend_is_found(tmp_path, rel, line):
    root = _copy(tmp_path)
    target = root / rel
    if line.startswith("    "):
        line = "def _lazy():\n" + line
    target.write_text(target.read_text() + "\n" + line)
    found = backend_violations(root)
    planted = f"{'/'.join(rel.split('/')[-2:])}:{len(target.read_text().splitlines())} "
    assert found and all(v.startswith(planted) for v in found), found


@pytest.mark.parametrize("rel", ["lockd/server/store/etcd/elections.py",
                                 "lockd/server/semaphores/observe.py"])
def test_a_missing_slice_or_backend_file_is_found(tmp_path, rel):
    root = _copy(tmp_path)
    (root / rel).unlink()
    assert layout_gaps(root) == [rel]


def test_a_module_over_the_limit_is_found(tmp_path):
    root = _copy(tmp_path)
    target = root / "lockd/server/core/names.py"
    target.write_text(target.read_text() + "# padding\n" * MAX_LINES)
    assert oversized(root) == [f"lockd/server/core/names.py: "
                               f"{len(target.read_text().splitlines())} lines"]


# --- no import cycles ---------------------------------------------------------------------------
# A cycle among modules makes import order matter and hides which side depends on which. Every
# import counts (module level, inside functions, under TYPE_CHECKING); ``from pkg import name``
# is an edge to ``pkg.name`` when that is a module, else to ``pkg`` (its ``__init__``). A
# package's ``__init__`` importing its own submodules is the normal re-export and no cycle
# unless a submodule imports the package back.


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of lockd/ and resource_proxy/ it imports."""
    files = {_module_name(root, p): p
             for top in ("lockd", "resource_proxy") for p in sorted((root / top).rglob("*.py"))}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        for _, target in _imports(root, path):
            while target and target not in files:
                target = target.rpartition(".")[0]
            if target and target != name:
                graph[name].add(target)
    return graph


def import_cycles(root: Path) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    graph = import_graph(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return cycles


def test_no_import_cycle():
    assert import_cycles(ROOT) == []


@pytest.mark.parametrize(("rel", "line"), [
    ("lockd/client/lease.py", "if TYPE_CHECKING:\n    from lockd.client.sync import LockClient\n"),
    ("resource_proxy/rows/tables.py", "def _lazy():\n    from resource_proxy import policy\n"),
])
def test_a_planted_cycle_is_found(tmp_path, rel, line):
    for top in ("lockd", "resource_proxy", "harness", "bench", "chaos"):
        shutil.copytree(ROOT / top, tmp_path / top,
                        ignore=shutil.ignore_patterns("__pycache__", "results"))
    target = tmp_path / rel
    target.write_text(target.read_text() + "\n" + line)
    cycles = import_cycles(tmp_path)
    assert cycles and any(_module_name(tmp_path, target) in c for c in cycles), cycles


# --- one rule for who may write -----------------------------------------------------------------
# Whether a token holds a lock shared decides whether it may write, so ``lockd.common.fencerule``
# is the only module that reads it (``Claims.shared``, ``Claims.mode_for``, ``Fence.shared``):
# every enforcement path, and any new resource kind, asks the rule instead of restating it.
# Checked in every module that sees tokens' claims: the proxy, the shared kit, and any module
# that imports ``lockd.tokens`` or the rule. An object's own ``self.shared`` is not a claim.

RULE = "lockd/common/fencerule.py"
_SHARED_READS = ("shared", "mode_for")


def _sees_claims(root: Path, path: Path) -> bool:
    rel = path.relative_to(root).as_posix()
    if rel.startswith(("resource_proxy/", "lockd/common/")):
        return True
    return any(_under(module, ("lockd.tokens", "lockd.common.fencerule"))
               for _, module in _imports(root, path))


def shared_claim_readers(root: Path) -> list[str]:
    """``file:line reads .shared`` for every read of a token's shared claim outside the rule."""
    found = []
    for top in ("lockd", "resource_proxy"):
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel in (RULE, "lockd/tokens.py") or not _sees_claims(root, path):
                continue
            for node in ast.walk(ast.parse(path.read_text(), rel)):
                name = None
                if isinstance(node, ast.Attribute) and node.attr in _SHARED_READS:
                    if not (isinstance(node.value, ast.Name) and node.value.id == "self"):
                        name = node.attr
                elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                      and node.func.id == "getattr" and len(node.args) > 1
                      and isinstance(node.args[1], ast.Constant)
                      and node.args[1].value in _SHARED_READS):
                    name = node.args[1].value
                if name is not None:
                    found.append(f"{rel}:{node.lineno} reads .{name}")
    return found


def test_only_the_rule_reads_a_tokens_shared_claim():
    assert (ROOT / RULE).is_file()
    assert shared_claim_readers(ROOT) == []


@pytest.mark.parametrize(("rel", "line"), [
    ("resource_proxy/rows/service.py", "def _lazy(claims):\n    return 'x' in claims.shared\n"),
    ("resource_proxy/store/postgres.py", "def _lazy(fence):\n    return fence.shared\n"),
    ("lockd/client/sqlfence.py", "def _lazy(c):\n    return c.mode_for('x') == 'shared'\n"),
    ("lockd/common/objects.py", "def _lazy(claims):\n    return getattr(claims, 'shared')\n"),
    ("lockd/guard.py", "from lockd.tokens import Claims\n\n\ndef _lazy(c: Claims):\n"
                       "    return c.shared\n"),
])
def test_a_planted_shared_claim_read_is_found(tmp_path, rel, line):
    for top in ("lockd", "resource_proxy", "harness", "bench", "chaos"):
        shutil.copytree(ROOT / top, tmp_path / top,
                        ignore=shutil.ignore_patterns("__pycache__", "results"))
    target = tmp_path / rel
    target.write_text((target.read_text() if target.exists() else "") + "\n" + line)
    found = shared_claim_readers(tmp_path)
    assert len(found) == 1 and found[0].startswith(rel + ":"), found


# --- the proxy's resource kinds: rows and objects side by side, over one fence core -----------
# Each kind is a slice with its routes, service and store: resource_proxy/rows and
# resource_proxy/objects. Neither imports the other. Both stand on the fence core: the one write
# rule (fencing, through lockd.common.fencerule), the claims and the token's verification
# (claims), the keys that verify tokens (jwks), idempotency, errors, JSON (codec) and the shared
# route pieces and problem mapping (api); the core imports neither slice. The objects slice
# also keeps off what is the tables' beside the slice: their hot path, the row SQL builder, the
# tables' policy and the OpenAPI document of the tables.

ROW_MODULES = ("resource_proxy.rows", "resource_proxy.hot", "resource_proxy.policy",
               "resource_proxy.store.sql", "resource_proxy.openapi")
OBJECT_MODULES = ("resource_proxy.objects",)
CORE = ("claims", "fencing", "idempotency", "codec", "jwks", "errors", "api")


def kind_violations(root: Path) -> list[str]:
    """Every import across the slices, or from the fence core into a slice."""
    out = [f"objects: {path.relative_to(root)}:{line} imports {module}"
           for path in _files(root, "resource_proxy/objects")
           for line, module in _imports(root, path) if _under(module, ROW_MODULES)]
    out += [f"rows: {path.relative_to(root)}:{line} imports {module}"
            for path in _files(root, "resource_proxy/rows")
            for line, module in _imports(root, path) if _under(module, OBJECT_MODULES)]
    for name in CORE:
        path = root / "resource_proxy" / f"{name}.py"
        out += [f"core: {path.relative_to(root)}:{line} imports {module}"
                for line, module in _imports(root, path)
                if _under(module, ("resource_proxy.rows",) + OBJECT_MODULES)]
    return out


def test_rows_and_objects_are_slices_over_one_fence_core():
    for part in ("rows/api.py", "rows/service.py", "objects/api.py", "objects/service.py",
                 "objects/store.py", "claims.py", "fencing.py"):
        assert (ROOT / "resource_proxy" / part).is_file(), part
    assert kind_violations(ROOT) == []


@pytest.mark.parametrize(("rel", "line", "side"), [
    ("resource_proxy/objects/service.py", "from resource_proxy.rows.service import RowService\n",
     "objects"),
    ("resource_proxy/objects/store.py", "    from resource_proxy.store.sql import SQLITE\n",
     "objects"),
    ("resource_proxy/objects/api.py", "from resource_proxy.rows import writes\n", "objects"),
    ("resource_proxy/rows/service.py", "from resource_proxy.objects.names import Buckets\n",
     "rows"),
    ("resource_proxy/claims.py", "    from resource_proxy.rows.service import RowService\n",
     "core"),
    ("resource_proxy/fencing.py", "from resource_proxy.objects import store\n", "core"),
])
def test_an_import_across_the_slices_is_found(tmp_path, rel, line, side):
    root = _copy(tmp_path)
    target = root / rel
    if line.startswith("    "):
        line = "def _lazy():\n" + line
    target.write_text(target.read_text() + "\n" + line)
    found = kind_violations(root)
    assert found and all(v.startswith(side + ":") for v in found), found
