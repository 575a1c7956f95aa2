"""What the generators of checked-in text share (architecture.py, profile_table.py, iam_roles_template.py):
a generated block between two markers of a document, and writing the text or checking it with ``--check``."""
from __future__ import annotations

import sys
from pathlib import Path


def between_markers(text: str, start: str, end: str, body: str, where: Path) -> str:
    """``text`` with what lies between ``start`` and ``end`` replaced by ``body``."""
    head, found, rest = text.partition(start)
    _, _, tail = rest.partition(end)
    if not found:
        raise SystemExit(f"{where} lacks the {start} marker")
    return f"{head}{start}\n{body}{end}{tail}"


def write_or_check(path: Path, wanted: str, argv: list[str], generator: str) -> int:
    """With ``--check`` in ``argv``: 1 (and a line on stderr) when ``path`` differs from ``wanted``, else
    0; without: write it."""
    if "--check" in argv:
        if path.read_text() != wanted:
            print(f"{path.name} is stale: run python scripts/{Path(generator).name}", file=sys.stderr)
            return 1
        return 0
    path.write_text(wanted)
    return 0
