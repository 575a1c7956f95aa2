"""The package's shape (docs/architecture.md): layers that only look down, no cycles, a stdlib core,
imports at module level but for the listed heavy libraries, small modules, private names private."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import architecture  # noqa: E402 - scripts/architecture.py: the layers and the map

LAYERS = architecture.LAYERS
# Imported inside the functions that use them, never at module level (docs/architecture.md, "Imports"):
# heavy libraries a DAG parse must not load; Airflow's server-side modules, which exist only in the API
# server and the scheduler and are still initialising when those load the plugin; and the reaper in the
# REST client, whose other commands start without Airflow.
LAZY = ("paramiko", "asyncssh", "matplotlib", "torch", "jinja2", "airflow.providers.ssh",
        "airflow.providers.smtp", "airflow.providers.slack", "airflow.api_fastapi.app", "airflow.models",
        "sqlalchemy", "ultracluster.ui.app", "ultracluster.reaper")
# Function-level imports that break an import cycle, not a heavy library: base_aws imports the session
# factory it is configured with while it is itself being imported (hooks/aws_session.py).
CYCLES = {("ultracluster.hooks.aws_session", "airflow.providers.amazon.aws.hooks.base_aws")}
MAX_LINES = 400
MODULES = architecture.modules()
layer = architecture.layer


def imports(path: Path) -> list[tuple[str, bool, int]]:
    return architecture.imports(path, MODULES)


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
    inside = [f"{module}:{line} {name}" for module, path in MODULES.items()
              for name, top, line in imports(path)
              if not top and not any(name == lazy or name.startswith(lazy + ".") for lazy in LAZY)
              and (module, name) not in CYCLES]
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


def test_the_map_in_the_docs_is_current_and_names_only_modules_that_exist():
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "architecture.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    text = (REPO / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"`(ultracluster(?:\.[a-zA-Z_0-9]+)+)", text))
    named |= {"ultracluster." + m for m in re.findall(r"`((?:run|parsers|hooks|triggers|operators|sensors|report|reaper|"
                                                     r"remote_commands|waiters|ui|cli)(?:\.[a-zA-Z_0-9]+)+)", text)}
    missing = [name for name in sorted(named) if not exists(name)]
    assert missing == []


def exists(name: str) -> bool:
    """A module, or a top-level name (then its attribute) of one: ``...sensors.fleet.FleetCheck``."""
    parts = name.split(".")
    for cut in range(len(parts), 1, -1):
        module = ".".join(parts[:cut])
        if module in MODULES:
            rest = parts[cut:]
            if not rest:
                return True
            tree = ast.parse(MODULES[module].read_text())
            defined = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
            defined |= {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
                        if isinstance(t, ast.Name)}
            defined |= {a.asname or a.name for node in tree.body if isinstance(node, ast.ImportFrom)
                        for a in node.names}
            return rest[0] in defined
    return False
