"""Pure functions that turn Airflow's and the local cluster's own records into spans (bench/pipeline.py).

Times are POSIX seconds (floats). Inputs are what the records hold: ISO timestamps (Airflow, the
local cluster's JSON), Slurm's job completion log (local time, whole seconds), moto's request log
(local time, whole seconds), the task log's structured lines ({"timestamp", "event", ...}).
Stdlib only.
"""
from __future__ import annotations

import datetime as dt
import re

JOB_FIELD = re.compile(r"(\w+)=(\S*)")
MOTO_TIME = re.compile(r"\[(\d{2}/\w{3}/\d{4} \d{2}:\d{2}:\d{2})\]")
SUBMITTED = re.compile(r"Submitted Slurm job (\d+)")


def parse_time(text: str | None) -> float | None:
    """ISO 8601 with Z, an offset or none (then local time, as Slurm writes it); None stays None."""
    if not text or text in ("Unknown", "None"):
        return None
    value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return value.timestamp()  # naive: local time, as the machine's Slurm wrote it


def moto_request_times(log_text: str) -> list[float]:
    """One time per request line of moto's server log (whole seconds, local time)."""
    times = []
    for line in log_text.splitlines():
        found = MOTO_TIME.search(line)
        if found and '"' in line:
            times.append(dt.datetime.strptime(found.group(1), "%d/%b/%Y %H:%M:%S").timestamp())
    return times


def jobcomp(text: str) -> dict[str, dict]:
    """Slurm's job completion log (jobcomp/filetxt): job id -> state, name and its times."""
    jobs = {}
    for line in text.splitlines():
        fields = dict(JOB_FIELD.findall(line))
        if "JobId" not in fields:
            continue
        jobs[fields["JobId"]] = {
            "state": fields.get("JobState"), "name": fields.get("Name"),
            "submit": parse_time(fields.get("SubmitTime")), "eligible": parse_time(fields.get("EligibleTime")),
            "start": parse_time(fields.get("StartTime")), "end": parse_time(fields.get("EndTime")),
        }
    return jobs


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Overlapping or touching intervals merged; empty and reversed ones dropped."""
    merged: list[list[float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def covered(intervals: list[tuple[float, float]], window: tuple[float, float] | None = None) -> float:
    """Seconds the union of ``intervals`` covers, clipped to ``window`` when given."""
    if window:
        intervals = [(max(s, window[0]), min(e, window[1])) for s, e in intervals]
    return sum(e - s for s, e in union(intervals))


def log_events(content: list) -> list[tuple[float, str]]:
    """A task log as Airflow's REST API serves it -> (time, event) sorted by time; lines without a
    timestamp (source headers) dropped."""
    events = []
    for line in content:
        if isinstance(line, dict) and line.get("timestamp") and "event" in line:
            events.append((parse_time(str(line["timestamp"])), str(line["event"])))
    return sorted(events, key=lambda e: e[0])


def worker_segments(events: list[tuple[float, str]]) -> list[tuple[float, float]]:
    """Spans on a worker: from "::group::Pre Execute" to the "::endgroup::" that closes the
    "Post Execute" group (after a return or "Pausing task as DEFERRED."). A log that stops inside a
    segment closes it at the last line seen."""
    segments, start, closing, last = [], None, False, None
    for t, event in events:
        if event.startswith("::group::Pre Execute"):
            if start is None:
                start, closing = t, False
        elif start is not None and (event.startswith("::group::Post Execute")
                                    or event.startswith("Pausing task as DEFERRED")):
            closing = True
        elif start is not None and closing and event.startswith("::endgroup::"):
            segments.append((start, t))
            start, closing = None, False
        if start is not None:
            last = t
    if start is not None and last is not None:
        segments.append((start, last))
    return segments


def times_of(events: list[tuple[float, str]], prefix: str) -> list[float]:
    return [t for t, event in events if event.startswith(prefix)]


def fired(events: list[tuple[float, str]]) -> list[float]:
    """Airflow's own record of each trigger event (the triggerer's "Trigger fired event" line)."""
    return times_of(events, "Trigger fired event")


def deferred(events: list[tuple[float, str]]) -> list[float]:
    return times_of(events, "Pausing task as DEFERRED")


def submitted_jobs(events: list[tuple[float, str]]) -> list[str]:
    return [m.group(1) for _, event in events for m in [SUBMITTED.search(event)] if m]


def deferred_windows(events: list[tuple[float, str]]) -> list[tuple[float, float]]:
    """Each deferral to the trigger event that ended it (a deferral without one is left out)."""
    windows, fires = [], fired(events)
    for start in deferred(events):
        end = next((t for t in fires if t >= start), None)
        if end is not None:
            windows.append((start, end))
    return windows


def count_in(times: list[float], windows: list[tuple[float, float]], slack: float = 0.0) -> int:
    """Times falling in any window, each window widened by ``slack`` on both sides (a record's
    resolution: 1 s for moto's log, the poll period for lines stamped when first seen)."""
    return sum(1 for t in times if any(s - slack <= t <= e + slack for s, e in windows))


def first_after(times: list[float], after: float) -> float | None:
    later = [t for t in times if t >= after]
    return min(later) if later else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    return numerator / denominator if numerator is not None and denominator else None
