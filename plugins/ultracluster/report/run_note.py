"""A run's note: its summary (``summary.py``'s lines, the client's end-of-run lines) as Markdown, for
the DAG run's note in the Airflow UI. ``ultracluster/listeners.py`` writes it when the run ends.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ultracluster.report.summary import run_summary, summary_lines

# Marks the part of a note this package writes: a user's own text before it is kept.
NOTE_TITLE = "**Run summary** (ultracluster)"
# DagRunNote.content is VARCHAR(1000).
NOTE_MAX_CHARS = 1000


def note_text(state: Any, xcoms: Mapping[str, Any], prices: Mapping[str, Any]) -> str:
    """The summary as a Markdown list: nodes, throughput, time to train, final loss, cluster wall time,
    idle fleet minutes, instance-hours and cost. ``xcoms``: task id -> return value (``records.XCOM_TASKS``)."""
    lines = summary_lines(run_summary(state, xcoms, prices))
    return "\n".join([NOTE_TITLE, "", *(f"- **{label}**: {text}" for label, text in lines)])


def merged_note(existing: str | None, summary: str) -> str | None:
    """The note to write: whatever a user wrote first, then ``summary`` (replacing an earlier summary,
    e.g. of a cleared run). None when the two do not fit in a note: the user's text is never cut."""
    user = (existing or "").split(NOTE_TITLE, 1)[0].rstrip()
    note = f"{user}\n\n{summary}" if user else summary
    return note if len(note) <= NOTE_MAX_CHARS else None
