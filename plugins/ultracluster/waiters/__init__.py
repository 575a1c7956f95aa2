"""Waiters as data: JSON models in botocore's waiter shape, evaluated here.

botocore cannot run them directly: pcluster is a CLI, not a botocore service.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

SUCCESS, FAILURE, RETRY = "success", "failure", "retry"


@lru_cache(maxsize=None)
def load_waiter(model: str, waiter_name: str) -> dict:
    """The waiter ``waiter_name`` of waiters/<model>.json: {delay, maxAttempts, acceptors}."""
    path = Path(__file__).with_name(f"{model}.json")
    waiters = json.loads(path.read_text())["waiters"]
    if waiter_name not in waiters:
        raise ValueError(f"No waiter {waiter_name!r} in {path.name}; known: {sorted(waiters)}")
    return waiters[waiter_name]


def evaluate(waiter: dict, response: dict | None = None, error: BaseException | None = None) -> str:
    """success/failure/retry for one poll: the first matching acceptor wins, like botocore."""
    for acceptor in waiter["acceptors"]:
        if acceptor["matcher"] == "path" and response is not None:
            if response.get(acceptor["argument"]) == acceptor["expected"]:
                return acceptor["state"]
        elif acceptor["matcher"] == "error" and error is not None:
            if acceptor["expected"] in {cls.__name__ for cls in type(error).__mro__}:
                return acceptor["state"]
    return RETRY
