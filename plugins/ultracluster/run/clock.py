"""Timestamps: ISO-8601 UTC strings in XComs, and their reading back (wall and idle times)."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat()


def iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).isoformat()


def parse_time(value: Any) -> datetime | None:
    """An ISO-8601 string (or datetime) as an aware datetime (naive means UTC); None if unreadable."""
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str) and value:
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    else:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def minutes_between(start: Any, end: Any) -> float | None:
    """Minutes from ``start`` to ``end`` (ISO strings); None when either is unknown or end < start."""
    first, last = parse_time(start), parse_time(end)
    if first is None or last is None or last < first:
        return None
    return (last - first).total_seconds() / 60
