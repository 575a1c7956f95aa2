"""The pipeline's retry policy: a call AWS denied fails its task at once, whatever the task's
``retries`` (``run.errors.denial_in``); every other failure keeps the task's own retries.

A denial answers the same until someone changes the role's policy (docs/operations.md, "Least
privilege"), so a retry would only keep a half-built cluster up longer. Airflow runs the policy in
the worker, with the exception in hand; the DAG's ``default_args`` give it to every task.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk.definitions.retry_policy import RetryDecision, RetryPolicy

from ultracluster.run.errors import aws_error_code, denial_in

if TYPE_CHECKING:
    from airflow.sdk import Context


class DeniedCallsFail(RetryPolicy):
    """AWS denied the call: fail without a retry, naming the code and AWS's own message (which names
    the action); anything else: the task's standard retries."""

    def evaluate(self, exception: BaseException, try_number: int, max_tries: int,
                 context: Context | None = None) -> RetryDecision:
        denial = denial_in(exception)
        if denial is None:
            return RetryDecision.default()
        message = (getattr(denial, "response", None) or {}).get("Error", {}).get("Message") or str(denial)
        return RetryDecision.fail(reason=f"AWS denied the call ({aws_error_code(denial)}: {message}); not retried: "
                                         "it is denied again until the role's policy allows it")

    def serialize(self) -> dict[str, Any]:
        return {"__type": type(self).__name__}

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> DeniedCallsFail:
        return cls()
