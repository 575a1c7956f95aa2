"""The package's map: each module's layer, what lives there (its docstring's first sentence) and who
imports it, written between the markers of docs/architecture.md.

    python scripts/architecture.py          rewrite the map
    python scripts/architecture.py --check  fail if the map is stale (tests/unit/test_layers.py)
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

from generated import between_markers, write_or_check  # scripts/generated.py

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "plugins" / "ultracluster"
DOC = REPO / "docs" / "architecture.md"
BEGIN, END = "<!-- map:start -->", "<!-- map:end -->"

# Bottom to top: a module imports from its own layer and the ones below, never above.
LAYERS = (
    ("core", ("ultracluster.run",)),
    ("parsers, commands", ("ultracluster.parsers", "ultracluster.remote_commands", "ultracluster.waiters",
                           "ultracluster.report")),
    ("hooks", ("ultracluster.hooks",)),
    ("triggers", ("ultracluster.triggers",)),
    ("operators, sensors", ("ultracluster.operators", "ultracluster.sensors", "ultracluster.links",
                            "ultracluster.notifications", "ultracluster.params", "ultracluster.reaper")),
    ("DAGs, CLI, UI", ("ultracluster.cli", "ultracluster.ui", "ultracluster.listeners", "ultracluster.cluster_tasks",
                       "ultracluster.executor",
                       "ultracluster.get_provider_info")),
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer(module: str) -> int:
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    if module == "ultracluster":
        return 0
    raise ValueError(f"{module} is in no layer: add it to LAYERS in scripts/architecture.py")


def imports(path: Path, known: dict[str, Path]) -> list[tuple[str, bool, int]]:
    """(imported module, at module level?, line) of a file; ``if TYPE_CHECKING:`` blocks left out."""
    found: list[tuple[str, bool, int]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                found.extend((alias.name, top, child.lineno) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and not child.level:
                found.append((child.module or "", top, child.lineno))
                # ``from ultracluster.run import states``: the submodule is the edge.
                found.extend((f"{child.module}.{a.name}", top, child.lineno) for a in child.names
                             if f"{child.module}.{a.name}" in known)
            visit(child, top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))

    visit(ast.parse(path.read_text()), True)
    return found


def summary(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    first = " ".join(doc.split("\n\n", 1)[0].split())
    return first.split(". ", 1)[0].rstrip(".")


def importers(known: dict[str, Path]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {m: set() for m in known}
    users = {**known, **{f"dags.{p.stem}": p for p in sorted((REPO / "dags").glob("*.py"))}}
    for user, path in users.items():
        for name, _, _ in imports(path, known):
            if name in known and name not in (user, "ultracluster"):  # the bare package is no dependency
                found[name].add(user)
    return found


def _short(users: set[str]) -> str:
    if not users:
        return "-"
    names = sorted(u.removeprefix("ultracluster.") for u in users)
    return ", ".join(names) if len(names) <= 4 else ", ".join(names[:4]) + f" and {len(names) - 4} more"


def map_markdown() -> str:
    known = modules()
    users = importers(known)
    rows = ["| layer | module | what lives there | imported by |", "|---|---|---|---|"]
    for module in sorted(known, key=lambda m: (layer(m), m)):
        text = summary(known[module]).replace("|", "\\|")
        rows.append(f"| {LAYERS[layer(module)][0]} | `{module}` | {text} | {_short(users[module])} |")
    return "\n".join(rows) + "\n"


def with_map(doc: str) -> str:
    return between_markers(doc, BEGIN, END, map_markdown(), DOC)


def main(argv: list[str]) -> int:
    return write_or_check(DOC, with_map(DOC.read_text()), argv, __file__)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
