"""The package's shape (docs/architecture.md): layers that only look down, no cycles, a stdlib core,
imports at module level but for the listed heavy libraries, small modules, private names private."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "plugins" / "ultracluster"

# Bottom to top: a module may import from its own layer and the ones below, never above.
LAYERS = (
    ("core", ("ultracluster.run",)),
    ("parsers and remote commands", ("ultracluster.parsers", "ultracluster.remote_commands", "ultracluster.waiters",
                                     "ultracluster.report")),
    ("hooks", ("ultracluster.hooks",)),
    ("triggers", ("ultracluster.triggers",)),
    ("operators and sensors", ("ultracluster.operators", "ultracluster.sensors", "ultracluster.links",
                               "ultracluster.notifications", "ultracluster.params", "ultracluster.reaper")),
    ("DAGs, CLI and UI", ("ultracluster.cli", "ultracluster.ui", "ultracluster.listeners",
                          "ultracluster.get_provider_info")),
)
# Imported inside the functions that use them, never at module level (docs/architecture.md, "Imports"):
# the heavy libraries a DAG parse must not load, and Airflow's server-side modules, which exist only in
# the API server and scheduler and are still initialising when those load the plugin.
LAZY = ("paramiko", "asyncssh", "matplotlib", "torch", "jinja2", "airflow.providers.ssh",
        "airflow.providers.smtp", "airflow.providers.slack", "airflow.api_fastapi.app", "airflow.models",
        "sqlalchemy", "ultracluster.ui.app")
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer(module: str) -> int:
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    if module == "ultracluster":
        return 0
    raise AssertionError(f"{module} is in no layer: add it to LAYERS and docs/architecture.md")


def imports(path: Path) -> list[tuple[str, bool, ast.AST]]:
    """(imported module, at module level?, node) of a file, ``if TYPE_CHECKING:`` blocks left out."""
    tree = ast.parse(path.read_text())
    found: list[tuple[str, bool, ast.AST]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                found.extend((alias.name, top, child) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and not child.level:
                found.append((child.module or "", top, child))
                # ``from ultracluster.run import states``: the submodule is the edge.
                found.extend((f"{child.module}.{a.name}", top, child) for a in child.names
                             if f"{child.module}.{a.name}" in MODULES)
            visit(child, top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))

    visit(tree, True)
    return found


def edges() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        targets = {name for name, top, _ in imports(path) if top and name in MODULES and name != module}
        graph[module] = targets
    return graph


def test_every_module_is_in_a_layer():
    for module in MODULES:
        layer(module)


def test_no_module_imports_from_a_layer_above_its_own():
    wrong = [f"{src} ({LAYERS[layer(src)][0]}) imports {dst} ({LAYERS[layer(dst)][0]})"
             for src, path in MODULES.items() for dst, _, _ in imports(path)
             if dst in MODULES and layer(dst) > layer(src)]
    assert wrong == []


def test_no_import_cycle():
    graph = edges()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def connect(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            # A package's __init__ importing its own submodules is no cycle unless one imports it back.
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in graph:
        if node not in index:
            connect(node)
    assert cycles == []


def test_the_core_imports_the_stdlib_and_itself_only():
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    outside = [f"{module}: {name}" for module, path in MODULES.items() if layer(module) == 0
               for name, _, _ in imports(path)
               if name.split(".")[0] not in stdlib and not name.startswith("ultracluster.run")]
    assert outside == []


def test_function_level_imports_are_only_the_listed_heavy_libraries():
    inside = [f"{module}:{node.lineno} {name}" for module, path in MODULES.items()
              for name, top, node in imports(path)
              if not top and not any(name == lazy or name.startswith(lazy + ".") for lazy in LAZY)]
    assert inside == []


def test_no_module_is_longer_than_the_limit():
    long = {module: n for module, path in MODULES.items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


@pytest.mark.parametrize("root", ["plugins", "dags", "tests", "bench"])
def test_private_names_stay_private(root):
    """No ``from <module> import _name`` across modules (fixtures are public names too)."""
    found = []
    for path in sorted((REPO / root).rglob("*.py")):
        if ".venvs" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(("ultracluster", "tests")):
                found += [f"{path.relative_to(REPO)}: {node.module}.{a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert found == []
