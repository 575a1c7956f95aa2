"""The run's own error, how a list of problems reads, and what an AWS error means for a retry:
throttling and unavailability pass; a denial (the caller's policy or credentials refuse the call)
repeats until someone changes them, so it fails the task at once; anything else is left to the
task's retries (botocore's ClientError carries the code in ``err.response["Error"]["Code"]``).
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
# IAM said no (EC2 says UnauthorizedOperation; S3's HEAD has no body, only its status), or the
# credentials are not the account's: the same call gets the same answer until a person acts.
DENIED_CODES = frozenset({
    "AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "AuthorizationError", "403",
    "AuthFailure", "InvalidClientTokenId", "InvalidAccessKeyId", "SignatureDoesNotMatch",
    "UnrecognizedClientException"})


def aws_error_code(err: Any) -> str:
    return str((getattr(err, "response", None) or {}).get("Error", {}).get("Code", ""))


def is_transient(err: Any) -> bool:
    return aws_error_code(err) in TRANSIENT_CODES


def denial_in(exc: BaseException | None) -> BaseException | None:
    """The AWS denial that caused ``exc`` (itself, or along its ``raise ... from`` / ``during
    handling`` chain), or None: an operator that wraps the ClientError still fails at once."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if aws_error_code(exc) in DENIED_CODES:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None
