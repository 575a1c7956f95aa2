"""The run's own error, how a list of problems reads, and which AWS errors are worth a retry:
throttling and unavailability pass, everything else repeats (botocore's ClientError carries the code
in ``err.response["Error"]["Code"]``).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class ConfigValidationError(ValueError):
    """The pipeline's params or the rendered cluster configuration are invalid (no retry helps)."""


def counted(items: Sequence[Any], noun: str) -> str:
    """``1 problem``, ``2 problems``."""
    return f"{len(items)} {noun}{'s' * (len(items) != 1)}"


def problem_list(lead: str, problems: Sequence[str]) -> str:
    """``lead``, then each problem on a line of its own (``- ...``). A problem's own line breaks are
    folded: one holding a list of its own, or a value with a newline, would read as several problems,
    and a count in ``lead`` would not match the lines listed."""
    return lead + ":\n- " + "\n- ".join(" ".join(str(problem).split()) for problem in problems)


TRANSIENT_CODES = frozenset({
    "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequestsException",
    "ServiceUnavailable", "InternalError", "InternalFailure", "RequestTimeout", "SlowDown"})


def aws_error_code(err: Any) -> str:
    return str(getattr(err, "response", {}).get("Error", {}).get("Code", ""))


def is_transient(err: Any) -> bool:
    return aws_error_code(err) in TRANSIENT_CODES
