"""Instance lives from EC2's describe-instances: when each instance started and stopped billing.

EC2 has no termination-time field: the time is in StateTransitionReason,
"User initiated (2026-12-01 05:31:46 GMT)" (moto writes UTC for GMT).
"""
from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

_TRANSITION_TIME = re.compile(r"\((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (?:GMT|UTC)\)")
# States in which an instance no longer bills for compute.
ENDED_STATES = ("shutting-down", "terminated", "stopping", "stopped")
NODE_TYPE_TAG = "parallelcluster:node-type"


def _aware(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    if isinstance(value, str) and value:
        try:
            return _aware(datetime.fromisoformat(value.replace("Z", "+00:00")))
        except ValueError:
            return None
    return None


def transition_time(reason: str | None) -> datetime | None:
    """The time in a StateTransitionReason, e.g. "User initiated (2026-12-01 05:31:46 GMT)"."""
    match = _TRANSITION_TIME.search(reason or "")
    if not match:
        return None
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)


def instance_life(instance: dict[str, Any], now: datetime) -> dict[str, Any]:
    """One instance of describe-instances as ``{"instance_id", "instance_type", "node_type",
    "launched_at", "ended_at", "hours", "ended"}``. A live instance is counted up to ``now``; an ended
    one whose end time is unreadable is too, and says so (``"ended": "unknown"``)."""
    launched = _aware(instance.get("LaunchTime"))
    state = (instance.get("State") or {}).get("Name")
    ended_at = transition_time(instance.get("StateTransitionReason")) if state in ENDED_STATES else None
    ended = "yes" if ended_at else ("unknown" if state in ENDED_STATES else "no")
    until = ended_at or now
    hours = max(0.0, (until - launched).total_seconds() / 3600) if launched else None
    tags = {t.get("Key"): t.get("Value") for t in instance.get("Tags") or []}
    return {
        "instance_id": instance.get("InstanceId"), "instance_type": instance.get("InstanceType"),
        "node_type": tags.get(NODE_TYPE_TAG) or "unknown",
        "launched_at": launched.isoformat() if launched else None,
        "ended_at": ended_at.isoformat() if ended_at else None, "hours": hours, "ended": ended,
    }
