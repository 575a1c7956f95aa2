"""No repeated code in the package: pylint's duplicate-code check, as `make test` runs it."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"


def test_plugins_hold_no_block_of_six_similar_lines():
    completed = subprocess.run(
        [sys.executable, "-m", "pylint", "--disable=all", "--enable=duplicate-code", "--min-similarity-lines=6",
         "--ignore-imports=y", "--ignore-docstrings=y", "--ignore-comments=y", "--score=n", "ultracluster"],
        cwd=PLUGINS, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stdout[-5000:] + completed.stderr[-2000:]
