"""The profile table of docs/operations.md, generated from include/profiles/*.json.

    python scripts/profile_table.py          rewrite the table in docs/operations.md
    python scripts/profile_table.py --check  exit 1 when the docs disagree with the profiles

Values are shown as written (``${VAR:-fallback}`` is read from the environment at parse time).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from generated import between_markers, write_or_check  # scripts/generated.py

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "operations.md"
START, END = "<!-- profile-table:start -->", "<!-- profile-table:end -->"
ORDER = ("production", "local")  # then any other profile, by name


def _cell(value) -> str:
    return f"`{json.dumps(value) if not isinstance(value, str) else value}`"


def render() -> str:
    paths = sorted((REPO / "include" / "profiles").glob("*.json"),
                   key=lambda p: (ORDER.index(p.stem) if p.stem in ORDER else len(ORDER), p.stem))
    profiles = {p.stem: json.loads(p.read_text()) for p in paths}
    keys = list(dict.fromkeys(k for body in profiles.values() for k in body if not k.startswith("_")))
    lines = ["| key | " + " | ".join(profiles) + " |", "|---|" + "---|" * len(profiles)]
    for key in keys:
        lines.append(f"| `{key}` | " + " | ".join(
            _cell(body[key]) if key in body else "-" for body in profiles.values()) + " |")
    return "\n".join(lines)


def with_table(text: str) -> str:
    return between_markers(text, START, END, render() + "\n", DOC)


def main() -> int:
    return write_or_check(DOC, with_table(DOC.read_text()), sys.argv[1:], __file__)


if __name__ == "__main__":
    sys.exit(main())
