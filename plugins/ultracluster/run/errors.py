"""The run's own error, and which AWS errors are worth a retry: throttling and unavailability pass,
everything else repeats (botocore's ClientError carries the code in ``err.response["Error"]["Code"]``).
"""
from __future__ import annotations

from typing import Any


class ConfigValidationError(ValueError):
    """The pipeline's params or the rendered cluster configuration are invalid (no retry helps)."""


TRANSIENT_CODES = frozenset({
    "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequestsException",
    "ServiceUnavailable", "InternalError", "InternalFailure", "RequestTimeout", "SlowDown"})


def aws_error_code(err: Any) -> str:
    return str(getattr(err, "response", {}).get("Error", {}).get("Code", ""))


def is_transient(err: Any) -> bool:
    return aws_error_code(err) in TRANSIENT_CODES
