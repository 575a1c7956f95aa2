"""Retry delays shared by the triggers."""

from __future__ import annotations

import random


def backoff(attempt: int, *, first: float = 1.0, cap: float = 60.0) -> float:
    """``first`` doubled per attempt up to ``cap``, with jitter (half of it random) so many triggers do
    not hammer a recovering sshd or API in lockstep."""
    base = min(first * 2.0 ** min(attempt, 10), cap)
    return base / 2 + random.uniform(0, base / 2)
