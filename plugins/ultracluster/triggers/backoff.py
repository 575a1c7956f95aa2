"""Retry delays shared by the triggers."""

from __future__ import annotations

import random

# A failing pcluster/AWS call (throttling, an unreachable API) backs off from the poll interval up to this.
API_BACKOFF_CAP_S = 300.0


def backoff(attempt: int, *, first: float = 1.0, cap: float = 60.0) -> float:
    """``first`` doubled per attempt up to ``cap``, with jitter (half of it random) so many triggers do
    not hammer a recovering sshd or API in lockstep."""
    base = min(first * 2.0 ** min(attempt, 10), cap)
    return base / 2 + random.uniform(0, base / 2)


def api_delay(poll_interval: float, consecutive_errors: int) -> float:
    """The next poll of a pcluster/AWS status: the interval, or after failed calls twice as long per
    failure, with jitter, up to API_BACKOFF_CAP_S (never below the interval)."""
    if not consecutive_errors:
        return poll_interval
    return max(poll_interval, backoff(consecutive_errors, first=poll_interval,
                                      cap=max(poll_interval, API_BACKOFF_CAP_S)))
