"""The layout is the architecture: no import cycles, and the engine imports nothing above it.

The imports of every module under ``src/flowscope`` are read with ``ast`` (imports inside
functions and under ``if TYPE_CHECKING:`` included, since a typing-only cycle is still a
knot a reader has to untie), resolved to module names, and checked against the layers
described in docs/design.md.
"""

from __future__ import annotations

import ast
from functools import cache, lru_cache
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = "flowscope"

# What the engine may never import: the adapters above it, and the libraries they wrap.
ENGINE = "flowscope.engine"
ENGINE_FORBIDDEN_PREFIXES = (
    "flowscope.observability",
    "flowscope.cli",
    "flowscope.export",
    "flowscope.adapters",
    "opentelemetry",
    "prometheus_client",
    "sqlite3",
    "sqlite_utils",
    "psycopg",
    "psycopg_pool",
    "click",
)
# The store package holds the port (store.base) and the adapters; only the port is allowed.
ENGINE_ALLOWED_STORE = {
    "flowscope.store.base",
    "flowscope.store.records",
    "flowscope.store.log",
    "flowscope.store.ownership",
    "flowscope.store.inbox",
    "flowscope.store.upkeep",
}
#: A module a newcomer reads in one sitting: no module of src/ is longer.
MAX_MODULE_LINES = 600
#: The store adapters: none imports another's modules (what they share lives in store/).
STORE_ADAPTERS = ("flowscope.store.memory", "flowscope.store.sqlite", "flowscope.store.postgres")
#: Private names of other libraries flowscope relies on, each for a reason:
PRIVATE_IMPORTS_ALLOWED = {
    # the ADK bridge observes ADK's own parallel worker and retry rule (notes: engines-and-fleets.md)
    ("google.adk.workflow._parallel_worker", "_ParallelWorker"),
    ("google.adk.workflow.utils._retry_utils", "_get_retry_delay"),
    ("google.adk.workflow.utils._retry_utils", "_should_retry_node"),
    # the LangGraph bridge asks LangGraph's own retry rule which failed attempts it retries
    ("langgraph.pregel._retry", "_should_retry_on"),
    # the metrics server keeps prometheus-client's quiet request handler
    ("prometheus_client.exposition", "_SilentHandler"),
}
#: Private modules of other libraries flowscope imports from, each for a reason:
PRIVATE_MODULES_ALLOWED = (
    # ADK keeps its workflow engine's classes (graph, nodes, node state) in private modules;
    # the bridge observes them where they are (notes: engines-and-fleets.md)
    "google.adk.workflow",
    "google.adk.utils._function_call_names",
    # the GenAI semantic conventions exist only as incubating attributes
    "opentelemetry.semconv._incubating",
    # LangGraph keeps its retry rule in a private module (the bridge asks it, not a copy)
    "langgraph.pregel._retry",
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((SRC / PACKAGE).rglob("*.py"))}


@cache  # a module's tree, parsed once for every check that reads it
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every module ``name`` imports, anywhere in its body, as absolute module names."""
    tree = parsed(path)
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for stmt in ast.walk(tree):
        if isinstance(stmt, ast.Import):
            found.update(alias.name for alias in stmt.names)
        elif isinstance(stmt, ast.ImportFrom):
            if stmt.level:
                base_parts = package.split(".")
                if stmt.level > 1:
                    base_parts = base_parts[: -(stmt.level - 1)]
                base = ".".join(base_parts)
                target = f"{base}.{stmt.module}" if stmt.module else base
            else:
                target = stmt.module or ""
            for alias in stmt.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
    return found


@lru_cache(maxsize=1)  # the tree does not change during a test session: parse it once
def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: {m for m in imports_of(name, path, known) if m != name} for name, path in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in edges:
                continue  # third-party or stdlib
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def engine_violations(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, targets in edges.items():
        if mod != ENGINE and not mod.startswith(ENGINE + "."):
            continue
        for t in sorted(targets):
            forbidden = any(t == p or t.startswith(p + ".") for p in ENGINE_FORBIDDEN_PREFIXES)
            store = (
                t == "flowscope.store" or t.startswith("flowscope.store.")
            ) and t not in ENGINE_ALLOWED_STORE
            if forbidden or store:
                bad.append(f"{mod} imports {t}")
    return bad


def long_modules(mods: dict[str, Path], limit: int = MAX_MODULE_LINES) -> list[str]:
    """``module (N lines)`` for every module longer than ``limit`` lines."""
    out = []
    for name, path in sorted(mods.items()):
        n = len(path.read_text().splitlines())
        if n > limit:
            out.append(f"{name} ({n} lines)")
    return out


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(name: str, path: Path) -> list[str]:
    """Private names ``name`` imports from another module: a ``_name`` from any module, or a
    private module (``pkg._mod``) from outside its own package ``pkg``."""
    tree = parsed(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    bad = []
    for stmt in ast.walk(tree):
        if isinstance(stmt, ast.ImportFrom):
            if stmt.level:
                base = package.split(".")
                if stmt.level > 1:
                    base = base[: -(stmt.level - 1)]
                target = ".".join(base) + (f".{stmt.module}" if stmt.module else "")
            else:
                target = stmt.module or ""
            for alias in stmt.names:
                full = f"{target}.{alias.name}"
                # a private submodule of the importer's own package is its package's business
                own_submodule = full.rpartition(".")[0] == package and target == package
                if (
                    _private(alias.name)
                    and (target, alias.name) not in PRIVATE_IMPORTS_ALLOWED
                    and not own_submodule
                ):
                    bad.append(f"{name} imports {alias.name} from {target}")
                bad.extend(_private_module(name, package, target))
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                bad.extend(_private_module(name, package, alias.name))
    return sorted(set(bad))


def _private_module(importer: str, package: str, target: str) -> list[str]:
    """A private module of flowscope imported from outside its package, or a third-party one
    not in :data:`PRIVATE_MODULES_ALLOWED`."""
    parts = target.split(".")
    for i, part in enumerate(parts):
        if _private(part):
            owner = ".".join(parts[:i])
            if target.startswith(PACKAGE + "."):
                if package == owner or package.startswith(owner + "."):
                    return []
            elif any(target == m or target.startswith(m + ".") for m in PRIVATE_MODULES_ALLOWED):
                return []
            return [f"{importer} imports the private module {target}"]
    return []


def adapter_crossings(edges: dict[str, set[str]]) -> list[str]:
    """``a imports b`` for every store adapter module that imports another adapter's."""

    def adapter(mod: str) -> str | None:
        return next((a for a in STORE_ADAPTERS if mod == a or mod.startswith(a + ".")), None)

    bad = []
    for mod, targets in sorted(edges.items()):
        mine = adapter(mod)
        if mine is None:
            continue
        for t in sorted(targets):
            theirs = adapter(t)
            if theirs is not None and theirs != mine:
                bad.append(f"{mod} imports {t}")
    return bad


def test_no_module_is_longer_than_six_hundred_lines():
    assert long_modules(modules()) == []


def test_no_private_name_is_imported_across_modules():
    bad = [b for name, path in modules().items() for b in private_imports(name, path)]
    assert bad == []


def test_the_store_adapters_import_none_of_each_others_modules():
    assert adapter_crossings(graph()) == []


def test_the_size_privacy_and_adapter_checks_catch_what_they_claim(tmp_path):
    big = tmp_path / "big.py"
    big.write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    small = tmp_path / "small.py"
    small.write_text("x = 1\n" * MAX_MODULE_LINES)
    assert long_modules({"flowscope.big": big, "flowscope.small": small}) == [
        f"flowscope.big ({MAX_MODULE_LINES + 1} lines)"
    ]

    m = tmp_path / "m.py"
    m.write_text(
        "from ..store.base import _hidden\n"
        "from ..adapters._recorder import BridgeRecorder\n"
        "from ._sibling import thing\n"
        "from prometheus_client.exposition import _SilentHandler\n"
        "from google.adk.workflow._other import _Thing\n"
        "from somelib._inner import Public\n"
    )
    assert private_imports("flowscope.adapters2.m", m) == [
        "flowscope.adapters2.m imports _Thing from google.adk.workflow._other",
        "flowscope.adapters2.m imports _hidden from flowscope.store.base",
        "flowscope.adapters2.m imports the private module flowscope.adapters._recorder",
        "flowscope.adapters2.m imports the private module somelib._inner",
    ]
    inside = tmp_path / "adk.py"
    inside.write_text("from ._recorder import BridgeRecorder\n")
    assert private_imports("flowscope.adapters.adk", inside) == []

    assert adapter_crossings(
        {
            "flowscope.store.sqlite.writer": {
                "flowscope.store.postgres.queries",
                "flowscope.store.appending",
            },
            "flowscope.store.memory": {"flowscope.store.takeover"},
        }
    ) == ["flowscope.store.sqlite.writer imports flowscope.store.postgres.queries"]


def test_the_walker_sees_the_package():
    edges = graph()
    # A walker that found nothing would pass every check below vacuously.
    assert "flowscope.engine.runner" in edges and "flowscope.cli" in edges
    assert "flowscope.events" in edges["flowscope.fold"]
    assert sum(len(t) for t in edges.values()) > 50


def test_no_import_cycles_typing_imports_included():
    assert cycles(graph()) == []


def test_the_engine_imports_no_store_adapter_observability_or_cli():
    assert engine_violations(graph()) == []


def test_the_checks_catch_what_they_claim(tmp_path):
    """The two checks fail on a cycle and on an engine import of an adapter."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert engine_violations(
        {"flowscope.engine.runner": {"flowscope.store.sqlite", "flowscope.store.base"}}
    ) == ["flowscope.engine.runner imports flowscope.store.sqlite"]
    # TYPE_CHECKING imports count.
    src = tmp_path / "m.py"
    src.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .cli import app\n")
    assert "flowscope.engine.cli.app" in imports_of("flowscope.engine.m", src, {"flowscope.engine.cli.app"})


@pytest.mark.slow
@pytest.mark.parametrize("mod", ["flowscope.engine", "flowscope.fold", "flowscope.events"])
def test_lower_layers_import_without_the_adapters(mod):
    """Importing the engine, the fold or the catalog pulls in no OpenTelemetry, Prometheus or CLI."""
    import subprocess
    import sys

    code = (
        f"import sys, {mod}\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('opentelemetry', 'prometheus_client', 'click')"
        " or m.startswith(('flowscope.observability', 'flowscope.cli', 'flowscope.store.sqlite'))]\n"
        "print(','.join(sorted(bad)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
