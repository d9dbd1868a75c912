"""The package walls: who may import whom, read from the source with ``ast``.

::

    lockd/client      talks HTTP only: nothing from lockd.server or resource_proxy
    resource_proxy    from lockd only lockd.tokens and lockd.common
    lockd/server/store  no web framework, no HTTP layer of lockd
    lockd/server/service.py  no web framework
    lockd/tokens.py, lockd/common  nothing of either service (nor of the client)

Every import counts: at module level, inside functions, under ``TYPE_CHECKING``. The walls are
checked on the real tree, and each is shown to bite by planting a forbidden import in a copy.
"""

from __future__ import annotations

import ast
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

WEB = ("fastapi", "starlette", "uvicorn")
HTTP_LAYER = ("lockd.common.middleware", "lockd.common.responses", "lockd.common.serving",
              "lockd.server.api", "lockd.server.app",
              "lockd.server.ops_api", "lockd.server.cli", "lockd.server.status_page",
              "lockd.server.schemas")


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
    ("3 stores know no web or HTTP layer", "lockd/server/store", WEB + HTTP_LAYER, ()),
    ("4 service knows no web framework", "lockd/server/service.py", WEB, ()),
    ("4 waiting knows no web framework", "lockd/server/waiting.py", WEB, ()),
    ("5 tokens import no service", "lockd/tokens.py",
     ("lockd.server", "lockd.client", "resource_proxy"), ()),
    ("5 common imports no service", "lockd/common",
     ("lockd.server", "lockd.client", "resource_proxy"), ()),
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
    ("lockd/client/lease.py", "import resource_proxy.tables\n", "1 client"),
    ("resource_proxy/service.py", "from lockd.server import service\n", "2 proxy"),
    ("resource_proxy/api.py", "from lockd.client import LockClient\n", "2 proxy"),
    ("resource_proxy/jwks.py", "from lockd import server\n", "2 proxy"),
    ("lockd/server/store/sqlite.py", "from starlette.responses import Response\n", "3 stores"),
    ("lockd/server/store/base.py", "from lockd.common.middleware import ROLE\n", "3 stores"),
    ("lockd/server/store/etcd/store.py", "    from ...api import create_router\n", "3 stores"),
    ("lockd/server/service.py", "from fastapi import Request\n", "4 service"),
    ("lockd/tokens.py", "from lockd.client.errors import InvalidToken\n", "5 tokens"),
    ("lockd/common/middleware.py", "from resource_proxy.errors import ProxyError\n", "5 common"),
]


@pytest.mark.parametrize(("rel", "line", "wall"), PLANTED, ids=[p[0] for p in PLANTED])
def test_a_planted_forbidden_import_breaks_its_wall(tmp_path, rel, line, wall):
    for top in ("lockd", "resource_proxy"):
        shutil.copytree(ROOT / top, tmp_path / top, ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / rel
    if line.startswith("    "):  # inside a function, where lazy imports hide
        line = "def _lazy():\n" + line
    target.write_text(target.read_text() + "\n" + line)
    found = violations(tmp_path)
    assert found and all(v.startswith(wall) for v in found), found


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
    ("resource_proxy/tables.py", "def _lazy():\n    from resource_proxy import policy\n"),
])
def test_a_planted_cycle_is_found(tmp_path, rel, line):
    for top in ("lockd", "resource_proxy"):
        shutil.copytree(ROOT / top, tmp_path / top, ignore=shutil.ignore_patterns("__pycache__"))
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
    ("resource_proxy/service.py", "def _lazy(claims):\n    return 'x' in claims.shared\n"),
    ("resource_proxy/store/postgres.py", "def _lazy(fence):\n    return fence.shared\n"),
    ("lockd/client/sqlfence.py", "def _lazy(c):\n    return c.mode_for('x') == 'shared'\n"),
    ("lockd/common/objects.py", "def _lazy(claims):\n    return getattr(claims, 'shared')\n"),
    ("lockd/guard.py", "from lockd.tokens import Claims\n\n\ndef _lazy(c: Claims):\n"
                       "    return c.shared\n"),
])
def test_a_planted_shared_claim_read_is_found(tmp_path, rel, line):
    for top in ("lockd", "resource_proxy"):
        shutil.copytree(ROOT / top, tmp_path / top, ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / rel
    target.write_text((target.read_text() if target.exists() else "") + "\n" + line)
    found = shared_claim_readers(tmp_path)
    assert len(found) == 1 and found[0].startswith(rel + ":"), found
