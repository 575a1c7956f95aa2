"""include/training/README.md's "Differences from the Neuron sample" table names every flag of the
training program, and only those: a flag added, renamed or removed must be placed against the sample."""
from __future__ import annotations

import re

from tests.training.support import TRAINING_DIR

README = TRAINING_DIR / "README.md"
PROGRAM = TRAINING_DIR / "dp_bert_large_hf_pretrain_hdf5.py"
# The differences the issue asked to be listed, each in the row of the flag it belongs to.
REQUIRED = {"--optimizer": ("trust-ratio clipping", "fp32"), "--warmup_steps": ("warm-up",),
            "--seed": ("data order",), "--metrics_file": ("metric names",)}


def program_flags() -> set[str]:
    return set(re.findall(r'add_argument\(\s*"(--[a-z0-9_]+)"', PROGRAM.read_text()))


def table_rows() -> dict[str, str]:
    section = README.read_text().split("## Differences from the Neuron sample", 1)[1]
    rows = {}
    for line in section.splitlines():
        match = re.match(r"^\| `(--[a-z0-9_]+)` \|(.*)\|$", line)
        if match:
            assert match.group(1) not in rows, f"{match.group(1)} listed twice"
            rows[match.group(1)] = match.group(2)
    return rows


def test_the_table_lists_exactly_the_programs_flags():
    assert len(program_flags()) > 20
    assert set(table_rows()) == program_flags()


def test_the_required_differences_are_in_their_rows():
    rows = table_rows()
    for flag, words in REQUIRED.items():
        assert all(word in rows[flag] for word in words), (flag, rows[flag])
